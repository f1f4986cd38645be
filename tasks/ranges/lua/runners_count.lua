-- runners_count.lua: how many runner messages of a range job are outstanding.
--
-- KEYS[1] the job's runners (range-runners:{JOB}): sorted set of runner tokens, each scored
--         with the millisecond (this server's clock) after which it no longer counts
-- Returns the number of tokens that still count; the others are removed. One clock: TIME.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
