-- Remove dead-lettered members from a queue's delay queue, as its drainer (seed 002).
--
-- The drainer stores a dead letter in the database first, then calls this; a drainer that
-- lost its lease in between removes nothing (the new holder dead-letters the entry again, so
-- it may be listed twice but is never lost).
--
-- KEYS[1]  lease:{node:N}:drain:QUEUE      the drainer's lease token
-- KEYS[2]  delay:{node:N}:QUEUE            sorted set of pending entries
-- KEYS[3]  drain-attempts:{node:N}:QUEUE   hash member -> failed attempts
-- ARGV[1]  token   ARGV[2 ..] members to remove
--
-- Returns {'OK', removed} or {'LOCK_FAILED', 0} (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return {'LOCK_FAILED', 0}
end
local removed = 0
for i = 2, #ARGV do
    removed = removed + redis.call('ZREM', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[3], ARGV[i])
end
return {'OK', removed}
