-- Take a drain batch from one queue's delay queue and count an attempt at each member first
-- (write-ahead), in one round trip (tasks.restock.drain, step 1 and 2 of its timeline).
--
-- KEYS[1]  delay:{stock:N}:QUEUE            sorted set entry -> due time in ms (shard clock)
-- KEYS[2]  drain-attempts:{stock:N}:QUEUE   hash member -> drain attempts at it
-- KEYS[3]  term:{stock:N}                   the shard's current term (missing: 0)
-- ARGV[1]  now: '' = the shard's clock (Redis TIME); a test's shared fake shard clock otherwise
-- ARGV[2]  limit, the most members to take
--
-- Returns {term, attempts, member, member, ...}: the shard's term, then the batch, earliest due
-- first, each member as the raw bytes stored, and the attempt count after this one, which is the
-- same for every member of the batch. The batch is every due member (at most `limit`), unless
-- one of them already has a count: a batch that never finished counted it, so it may be what
-- killed that drainer, and it is taken alone (the first such member), so a poison entry sinks
-- only itself. So a batch of several members holds first attempts only (count 1), and a lone
-- member carries its own count; one count per batch halves the reply. Nothing due: {term}.
-- The term is read with the batch: the drainer releases only the items of entries of that term,
-- the ones restock.lua will not drop as WRONG_TERM (only a rebuild changes the term, and
-- restock.lua refuses the batch while one runs).
local now = ARGV[1]
if now == '' then
    local time = redis.call('TIME')
    now = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
end
local term = redis.call('GET', KEYS[3]) or '0'
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #due do  -- HEXISTS one by one: unpack() of a large batch would overflow Lua's stack
    if redis.call('HEXISTS', KEYS[2], due[i]) == 1 then
        return {term, redis.call('HINCRBY', KEYS[2], due[i], 1), due[i]}
    end
end
if #due == 0 then
    return {term}
end
local reply = {term, 1}
for i = 1, #due do
    redis.call('HSET', KEYS[2], due[i], 1)  -- none had a count: the first attempt of each
    reply[i + 2] = due[i]
end
return reply
