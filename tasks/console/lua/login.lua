-- login.lua: one login attempt, counted before its password is checked, so that parallel
-- guesses cannot all reach the check before the first failure is recorded.
--
-- KEYS[1] failed logins of the user     (console-login:{console}:fails:user:DIGEST)
-- KEYS[2] failed logins from the address (console-login:{console}:fails:addr:ADDRESS)
-- KEYS[3] lockout of the user, KEYS[4] lockout of the address (...:lock:user|addr:...)
-- ARGV[1] attempts a user has before a lockout, ARGV[2] the same for an address
-- ARGV[3] first back-off (ms), ARGV[4] longest back-off (ms)
-- ARGV[5] what a lockout adds for the attempt's own failure delay (ms)
-- ARGV[6] the counters' TTL (s) after the last attempt
-- Returns {allowed, wait_ms, user_failures, user_lock_ms, address_failures, address_lock_ms}.
-- allowed 0: locked out, nothing counted, wait_ms is the lockout's time left. allowed 1: check
-- the password; the attempt is already counted as failed (a success deletes the four keys),
-- and a lock_ms above 0 is the lockout this attempt set, its back-off doubling with every
-- failure past the free ones. One clock: the server's (PX, PTTL).
local wait = math.max(redis.call('PTTL', KEYS[3]), redis.call('PTTL', KEYS[4]))
if wait > 0 then
    return {0, wait, 0, 0, 0, 0}
end
local function count(fails, lock, free)
    local n = redis.call('INCR', fails)
    redis.call('EXPIRE', fails, tonumber(ARGV[6]))
    if n < free then
        return {n, 0}
    end
    local backoff = math.min(tonumber(ARGV[3]) * 2 ^ (n - free), tonumber(ARGV[4]))
    local ms = math.floor(backoff) + tonumber(ARGV[5])
    redis.call('SET', lock, n, 'PX', ms)
    return {n, ms}
end
local user = count(KEYS[1], KEYS[3], tonumber(ARGV[1]))
local address = count(KEYS[2], KEYS[4], tonumber(ARGV[2]))
return {1, 0, user[1], user[2], address[1], address[2]}
