-- Extend a lease, only if the caller still holds it.
--
-- KEYS[1]  lease:{NAME}   string, the holder's token
-- ARGV[1]  token          the caller's token
-- ARGV[2]  ttl_ms         new TTL in milliseconds (replaces the remaining TTL)
--
-- Returns 1 when renewed, 0 when the token does not match (expired, released, or held by
--         someone else): nothing is changed then.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
