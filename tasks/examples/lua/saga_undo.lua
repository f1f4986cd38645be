-- Undo one step of a demo saga's ledger: idempotent, and a no-op for a step that never ran.
--
-- KEYS[1]  saga:{ORDER}   list of the step and undo names applied to the order, in order
-- ARGV[1]  step           the step to undo (e.g. "ship")
-- ARGV[2]  undo           the entry its compensation appends (e.g. "cancel_shipment")
-- ARGV[3]  ttl_ms         the ledger's TTL (JOURNAL_RETENTION), refreshed
--
-- Returns 1 when `undo` was appended: the ledger held more `step` than `undo` entries.
--         0 otherwise: the step never ran (its compensation ran ahead of a write-ahead step's
--         effect), or it was undone already (the compensation ran twice). So a compensation
--         may run any number of times, before or after its step's effect, and the ledger
--         still ends with one undo per step that ran.
local done, undone = 0, 0
for _, entry in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    if entry == ARGV[1] then
        done = done + 1
    elseif entry == ARGV[2] then
        undone = undone + 1
    end
end
if done <= undone then
    return 0
end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
