-- Take a lease if it is free, and hand out the next fencing token.
--
-- KEYS[1]  lease:{NAME}           string, the holder's token; PX = lease TTL
-- KEYS[2]  fence:{NAME}           integer counter, no TTL unless ARGV[5] gives one
-- KEYS[3]  lease-waiting:{NAME}   optional, passed only by a blocking acquire: set when refused,
--                                 so the holder's release knows to wake a waiter
-- ARGV[1]  token                  random token of the would-be holder
-- ARGV[2]  ttl_ms                 lease TTL in milliseconds
-- ARGV[3]  fence_floor            optional (absent or 0: no floor): the counter is raised past
--                                 this first, so a counter that Redis lost never hands out a
--                                 used fence again
-- ARGV[4]  waiting_ms             with KEYS[3]: PX of the waiting flag (the waiter's longest wait);
--                                 otherwise ignored (0 when ARGV[5] follows)
-- ARGV[5]  fence_ttl_ms           optional: the fence counter expires this long after the acquire
--                                 (for a lease whose fence no durable store relies on, or whose
--                                 store passes fence_floor); absent: the counter never expires
--
-- Returns fence (an integer) when acquired: the counter after INCR (and above fence_floor),
--         so it strictly increases across every acquire of NAME.
--         {pttl} (an array of one integer) when held by someone else: pttl is the holder's
--         remaining TTL in ms (-1 if the key has no TTL), so a waiter knows how long to block
--         without a second round trip.
-- (A bare integer, not {1, fence}: the acquire is the hot path, and a client parses one
-- integer reply for less than an array.)
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local fence = redis.call('INCR', KEYS[2])
    local floor = tonumber(ARGV[3]) or 0
    if fence <= floor then
        fence = floor + 1
        redis.call('SET', KEYS[2], fence)
    end
    if ARGV[5] then
        redis.call('PEXPIRE', KEYS[2], ARGV[5])
    end
    return fence
end
if KEYS[3] then
    redis.call('SET', KEYS[3], '1', 'PX', ARGV[4])
end
return {redis.call('PTTL', KEYS[1])}
