-- End a lease whose holder is known to be gone (its process exited), only if the lease is
-- still the one handed out with the given fence; if someone waits for it, wake one.
--
-- KEYS[1]  lease:{NAME}           string, the holder's token
-- KEYS[2]  fence:{NAME}           integer counter: the fence of the newest acquire
-- KEYS[3]  lease-waiting:{NAME}   exists while a blocking acquirer may be waiting
-- KEYS[4]  lease-wake:{NAME}      list holding at most one wake marker; PX = ARGV[2]
-- ARGV[1]  fence                  the fence the gone holder was handed
-- ARGV[2]  wake_ttl_ms            as release.lua's
--
-- Returns 1 when revoked; 0 when the lease is free, or the counter moved past `fence` (a
--         later acquire holds it, or held it and let it go): nothing is changed then.
--
-- Why the fence identifies the holder: acquire.lua sets lease:{NAME} and INCRs the counter
-- in one script, so while the key exists the counter is its holder's fence. (A Redis that
-- lost the counter may hand one fence out twice; the stores' fences keep writes exactly once
-- whatever a revoke ends.)
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('GET', KEYS[2]) ~= ARGV[1] then
    return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('DEL', KEYS[4])
    redis.call('RPUSH', KEYS[4], '1')
    redis.call('PEXPIRE', KEYS[4], ARGV[2])
end
return 1
