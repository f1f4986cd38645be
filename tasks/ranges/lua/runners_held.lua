-- runners_held.lua: runner tokens a worker holds count for a while longer, if they still count.
--
-- KEYS[1] the job's runners (range-runners:{JOB}): sorted set of runner tokens, each scored
--         with the millisecond (this server's clock) after which it no longer counts
-- ARGV[1] how long (ms) each token counts from now
-- ARGV[2..] the tokens
-- A token that is not in the set (ended, or no longer counting) is left out: a worker's hold
-- never brings a runner back. Returns how many tokens were marked. One clock: TIME.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local marked = 0
for i = 2, #ARGV do
    marked = marked + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[i])
end
if marked > 0 and redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
end
return marked
