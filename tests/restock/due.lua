-- The due entries of one queue's delay queue, by the node's clock (seed 002).
--
-- KEYS[1]  delay:{stock:N}:QUEUE   sorted set entry -> due time in ms (node clock)
-- ARGV[1]  now: '' = the node's clock (Redis TIME); a test's shared fake node clock otherwise
-- ARGV[2]  limit, the most members to return
--
-- Returns the members (raw bytes, whatever they hold) with a due time <= now, earliest first.
-- "Now" is read here, on the clock that stamped the entries, so a drainer whose own clock runs
-- fast cannot release anything early.
local now = ARGV[1]
if now == '' then
    local time = redis.call('TIME')
    now = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
end
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
