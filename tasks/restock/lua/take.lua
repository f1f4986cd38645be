-- Take a drain batch from one queue's delay queue and count an attempt at each member first
-- (write-ahead), in one round trip (tasks.restock.drain, step 1 and 2 of its timeline).
--
-- KEYS[1]  delay:{stock:N}:QUEUE            sorted set entry -> due time in ms (shard clock)
-- KEYS[2]  drain-attempts:{stock:N}:QUEUE   hash member -> drain attempts at it
-- ARGV[1]  now: '' = the shard's clock (Redis TIME); a test's shared fake shard clock otherwise
-- ARGV[2]  limit, the most members to take
--
-- Returns {member, attempts, member, attempts, ...}: the batch, earliest due first, each member
-- as the raw bytes stored and its attempt count after this one. The batch is every due member
-- (at most `limit`), unless one of them already has a count: a batch that never finished
-- counted it, so it may be what killed that drainer, and it is taken alone (the first such
-- member), so a poison entry sinks only itself. Nothing due: an empty list.
local now = ARGV[1]
if now == '' then
    local time = redis.call('TIME')
    now = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local batch = due
for i = 1, #due do  -- HEXISTS one by one: unpack() of a large batch would overflow Lua's stack
    if redis.call('HEXISTS', KEYS[2], due[i]) == 1 then
        batch = {due[i]}
        break
    end
end
local reply = {}
for i = 1, #batch do
    reply[2 * i - 1] = batch[i]
    reply[2 * i] = redis.call('HINCRBY', KEYS[2], batch[i], 1)
end
return reply
