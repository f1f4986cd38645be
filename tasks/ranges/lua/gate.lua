-- gate.lua: a range job's controls and its cluster-wide throttle, read once per batch.
--
-- KEYS[1] control hash of the job (range-control:{JOB}): `state` (paused | cancelled), `rate`
--         (rows per second; absent or 0: no throttle)
-- KEYS[2] throttle of the job (range-throttle:{JOB}): the GCRA theoretical arrival time, in
--         milliseconds of this server's clock
-- KEYS[3] orphans of the job (range-orphans:{JOB}): partitions whose holder died
-- ARGV[1] rows to reserve for the batch about to run
-- ARGV[2] rows to add to (positive) or take back from (negative) the previous reservation,
--         now that its batch's real size is known
-- ARGV[3] '1' if the caller may adopt one (it then stops its own partition at this boundary)
-- ARGV[4] the caller's own partition on its first call ('' after): it is claimed, so it is
--         nobody's orphan any more
-- Returns {state, wait_ms, reserved, orphan}: a non-empty state means stop (nothing is
-- reserved); a non-empty orphan is a partition the caller adopted (popped: no other caller
-- gets it; nothing is reserved: the caller runs no batch of its own); otherwise the caller
-- waits wait_ms before its batch, for which `reserved` rows (0 when the job is not
-- throttled) were reserved. Every worker reserves from the same arrival time, so all of a
-- job's partitions together stay under `rate`. One clock: the server's TIME.
local control = redis.call('HMGET', KEYS[1], 'state', 'rate')
local state = control[1]
if state and state ~= '' then
    return {state, 0, 0, ''}
end
if ARGV[4] ~= '' then
    redis.call('SREM', KEYS[3], ARGV[4])
end
local rate = tonumber(control[2] or '0') or 0
local orphan = false
if ARGV[3] == '1' then
    orphan = redis.call('SPOP', KEYS[3])
end
if rate <= 0 then
    return {'', 0, 0, orphan or ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local per_row = 1000 / rate
local tat = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
tat = tat + tonumber(ARGV[2]) * per_row
local start = math.max(tat, now)
-- An adopting caller runs no batch of its own: the previous one is settled, nothing reserved.
local rows = orphan and 0 or tonumber(ARGV[1])
local next_tat = start + rows * per_row
redis.call('SET', KEYS[2], string.format('%.3f', next_tat),
           'PX', math.max(1, math.ceil(next_tat - now)) + 1000)
if orphan then
    return {'', 0, 0, orphan}
end
return {'', math.floor(start - now), rows, ''}
