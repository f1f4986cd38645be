-- Apply one step of a demo saga to its ledger, only while the step's execution owns its journal.
--
-- KEYS[1]  saga:{ORDER}          list of the step and undo names applied to the order
-- KEYS[2]  lease:{journal:TASK}  the journal lease (tasks.rollback.fences.Fence.key)
-- ARGV[1]  token                 the owner's token (Fence.token)
-- ARGV[2]  step                  the entry to append (e.g. "ship")
-- ARGV[3]  ttl_ms                the ledger's TTL (JOURNAL_RETENTION), refreshed
--
-- Returns 1 when the step was appended, 0 when it was refused: the lease key is gone or holds
-- another token, so the sweeper (or a later delivery) may be compensating the saga already,
-- and a step appended now would land after its compensation began.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
    return 0
end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
