-- runners_mark.lua: count runner tokens of a range job as outstanding for a while longer.
--
-- KEYS[1] the job's runners (range-runners:{JOB}): sorted set of runner tokens, each scored
--         with the millisecond (this server's clock) after which it no longer counts
-- ARGV[1] how long (ms) each token counts from now
-- ARGV[2] the bound: a token not in the set yet is added only while fewer than this many
--         count ('0': no bound, the caller already counted the room it fills)
-- ARGV[3..] the tokens
-- Returns how many tokens were marked (a token refused for the bound is left out). The key
-- expires when its last token would.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local bound = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local marked = 0
for i = 3, #ARGV do
    local known = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if known or bound == 0 or redis.call('ZCARD', KEYS[1]) < bound then
        redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
        marked = marked + 1
    end
end
if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
end
return marked
