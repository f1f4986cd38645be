-- Move the next redo-log entries of one queue into its delay queue (seed 002).
--
-- The log is read with an XRANGE cursor rather than a consumer group: each call is atomic, so
-- concurrent syncs of one queue simply continue each other, and a cursor is one hash that an
-- operator can inspect or reset. The cursor only moves past entries that were added to the
-- delay queue, so a refused sync leaves them to the next call (backpressure). Entries before
-- the cursor are then trimmed from the stream (the delay queue holds them now): a node keeps
-- each pending entry once, not twice.
--
-- KEYS[1]  redo:{stock:N}:QUEUE         stream written by deduct.lua ({e = entry, t = time_ms})
-- KEYS[2]  redo-cursor:{stock:N}:QUEUE  hash {id = last synced stream id, score = its score}
-- KEYS[3]  delay:{stock:N}:QUEUE        sorted set entry -> due time in ms
-- KEYS[4]  lease:{stock:N}:maintenance  exists while the shard is being rebuilt
-- ARGV[1]  count      most entries to move in this call
-- ARGV[2]  capacity   the delay queue refuses new entries once it holds this many
-- ARGV[3]  delay_ms   due time = entry time + delay_ms
--
-- Returns {'OK', moved}             moved entries (0 when the log is drained)
--         {'MAINTAINING', 0}        the shard is in maintenance; nothing moved
--         {'FULL', size}            the delay queue holds >= capacity entries; nothing moved
-- Scores strictly increase in log (= offset) order: a score is max(time + delay, previous + 1),
-- where "previous" is the cursor's score or the highest score queued, whichever is higher.
-- restock.lua skips an entry whose offset is not above the SKU's stored offset (unless it is
-- still the deduction on record), so an entry must never become due after a later entry of
-- the same queue, whatever the callers' clocks. An entry already queued keeps its score
-- (ZADD NX): re-running a sync after a crash, or after the cursor was reset (a redelivery),
-- neither moves a queued entry ahead of the lower offsets queued before it nor queues a new
-- entry ahead of them.
-- A message without an entry (written by something else than deduct.lua) is queued as
-- 'MALFORMED:<stream id>' and one without a time is due at once: the drainer's parser then
-- dead-letters it, so a bad message neither blocks the log nor vanishes.
if redis.call('EXISTS', KEYS[4]) == 1 then
    return {'MAINTAINING', 0}
end
local size = redis.call('ZCARD', KEYS[3])
local capacity = tonumber(ARGV[2])
if size >= capacity then
    return {'FULL', size}
end
local count = math.min(tonumber(ARGV[1]), capacity - size)
local cursor = redis.call('HGET', KEYS[2], 'id') or '0-0'
local last_score = tonumber(redis.call('HGET', KEYS[2], 'score') or '-1')
local top = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) > last_score then
    last_score = tonumber(top[2])
end
local messages = redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', count)
local delay = tonumber(ARGV[3])
for _, message in ipairs(messages) do
    local fields = message[2]
    local entry, time_ms
    for i = 1, #fields, 2 do
        if fields[i] == 'e' then entry = fields[i + 1] elseif fields[i] == 't' then
            time_ms = tonumber(fields[i + 1])
        end
    end
    entry = entry or ('MALFORMED:' .. message[1])
    local score = math.max((time_ms or 0) + delay, last_score + 1)
    if redis.call('ZADD', KEYS[3], 'NX', string.format('%d', score), entry) == 1 then
        last_score = score
    end
    cursor = message[1]
end
if #messages > 0 then
    redis.call('HSET', KEYS[2], 'id', cursor, 'score', string.format('%d', last_score))
    redis.call('XTRIM', KEYS[1], 'MINID', cursor)
end
return {'OK', #messages}
