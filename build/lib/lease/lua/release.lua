-- Give a lease up, only if the caller still holds it; if someone waits for it, wake one.
--
-- KEYS[1]  lease:{NAME}           string, the holder's token
-- KEYS[2]  lease-waiting:{NAME}   exists while a blocking acquirer may be waiting
-- KEYS[3]  lease-wake:{NAME}      list holding at most one wake marker; PX = ARGV[2]
-- ARGV[1]  token                  the caller's token
-- ARGV[2]  wake_ttl_ms            how long the marker waits for a waiter that is between its
--                                 refused acquire and its BLPOP
--
-- Returns 1 when released, 0 when the token does not match (expired or held by someone else):
--         nothing is changed then.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
    -- Keep at most one marker, so releases nobody waited for cannot pile up spurious wakes.
    redis.call('DEL', KEYS[3])
    redis.call('RPUSH', KEYS[3], '1')
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return 1
