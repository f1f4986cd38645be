-- Remove dead-lettered members from a queue's delay queue, as its drainer.
--
-- The drainer stores a dead letter in the database first, then calls this; a drainer that
-- lost its lease in between removes nothing (the new holder dead-letters the entry again, so
-- it may be listed twice but is never lost). Members are raw bytes: a member that is not even
-- UTF-8 is removed exactly as it is stored.
--
-- KEYS[1]  lease:{stock:N}:drain:QUEUE      the drainer's lease token
-- KEYS[2]  delay:{stock:N}:QUEUE            sorted set of pending entries
-- KEYS[3]  drain-attempts:{stock:N}:QUEUE   hash member -> drain attempts
-- KEYS[4]  deducted:{stock:N}               hash order_item_id -> entry text (on record)
-- ARGV[1]  token   ARGV[2 ..] members to remove
--
-- Returns {'OK', removed} or {'LOCK_FAILED', 0} (nothing changed). A member that is the
-- deduction on record of its order item (the text before its first ':') takes the record with
-- it: the dead letter now holds it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return {'LOCK_FAILED', 0}
end
local removed = 0
for i = 2, #ARGV do
    local member = ARGV[i]
    removed = removed + redis.call('ZREM', KEYS[2], member)
    redis.call('HDEL', KEYS[3], member)
    local order_item = string.match(member, '^([^:]+):')
    if order_item and redis.call('HGET', KEYS[4], order_item) == member then
        redis.call('HDEL', KEYS[4], order_item)
    end
end
return {'OK', removed}
