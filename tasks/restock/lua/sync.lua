-- Move the next redo-log entries of one queue into its delay queue.
--
-- The log is read with an XRANGE cursor rather than a consumer group: each call is atomic, so
-- concurrent syncs of one queue simply continue each other, and a cursor is one hash that an
-- operator can inspect or reset. The cursor only moves past entries that were added to the
-- delay queue, so a refused sync leaves them to the next call (backpressure). Entries before
-- the cursor are then trimmed from the stream (the delay queue holds them now): a shard keeps
-- each pending entry once, not twice.
--
-- KEYS[1]  redo:{stock:N}:QUEUE         stream written by deduct.lua ({e = entry, t = time_ms})
-- KEYS[2]  redo-cursor:{stock:N}:QUEUE  hash {id = last synced stream id, score = its score}
-- KEYS[3]  delay:{stock:N}:QUEUE        sorted set entry -> due time in ms
-- KEYS[4]  lease:{stock:N}:maintenance  exists while the shard is being rebuilt
-- ARGV[1]  count      most entries to move in this call
-- ARGV[2]  capacity   the delay queue refuses new entries once it holds this many
-- ARGV[3]  delay_ms   due time = entry time + delay_ms
-- ARGV[4]  now: '' = the shard's clock (Redis TIME); a test's shared fake shard clock otherwise
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
-- 'MALFORMED:<stream id>', due at once: the drainer's parser dead-letters it, so a bad
-- message neither blocks the log nor vanishes.
--
-- Times come from outside (the stream field t), so they are clamped before they order or
-- delay anything: an entry's time that is not a count of milliseconds of at most 15 digits
-- (missing, negative, 'inf', '1e300') or that lies ahead of the shard's clock counts as now. The
-- message exists, so the deduction happened by now: the entry is never due early, and one
-- far-future time cannot push every later entry (score = previous + 1) years ahead.
-- A queued score or cursor score beyond now + delay + capacity is poison from before (a
-- shard whose clock ran ahead before a failover, a version without the clamp): no entry can
-- be due later than that (a time is at most now; the +1 rule adds at most one millisecond
-- per queued entry), so it is ignored as "previous", and up to `count` such members per
-- call are re-scored as if synced now. A rebuild leaves the delay queue and cursor alone,
-- so this is also what keeps a rebuild from carrying a poisoned maximum over.
if redis.call('EXISTS', KEYS[4]) == 1 then
    return {'MAINTAINING', 0}
end
local now = ARGV[4]
if now == '' then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
    now = tonumber(now)
end
local count, capacity, delay = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local horizon = now + delay + capacity
local function ms(value) return string.format('%d', value) end

local cursor = redis.call('HGET', KEYS[2], 'id') or '0-0'
local last_score = tonumber(redis.call('HGET', KEYS[2], 'score') or '-1')
local rewrite_cursor = last_score == nil or not (last_score <= horizon)  -- nan too
if rewrite_cursor then
    last_score = -1
end
local top = redis.call('ZREVRANGEBYSCORE', KEYS[3], ms(horizon), '-inf', 'WITHSCORES',
                       'LIMIT', 0, 1)
if top[2] and tonumber(top[2]) > last_score then
    last_score = tonumber(top[2])
end
local poisoned = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ms(horizon), '+inf', 'LIMIT', 0,
                            count)
for _, member in ipairs(poisoned) do
    last_score = math.max(now + delay, last_score + 1)
    redis.call('ZADD', KEYS[3], 'XX', ms(last_score), member)
    rewrite_cursor = true
end

local size = redis.call('ZCARD', KEYS[3])
local messages = {}
if size < capacity then
    messages = redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT',
                          math.min(count, capacity - size))
end
for _, message in ipairs(messages) do
    local fields = message[2]
    local entry, time_ms
    for i = 1, #fields, 2 do
        if fields[i] == 'e' then
            entry = fields[i + 1]
        elseif fields[i] == 't' and string.match(fields[i + 1], '^%d+$')
                and #fields[i + 1] <= 15 then
            time_ms = tonumber(fields[i + 1])
        end
    end
    if entry == nil then
        entry, time_ms = 'MALFORMED:' .. message[1], 0  -- no entry to hold back: due at once
    elseif time_ms == nil or time_ms > now then
        time_ms = now
    end
    local score = math.max(time_ms + delay, last_score + 1)
    if redis.call('ZADD', KEYS[3], 'NX', ms(score), entry) == 1 then
        last_score = score
    end
    cursor = message[1]
end
if #messages > 0 then
    redis.call('HSET', KEYS[2], 'id', cursor, 'score', ms(last_score))
    redis.call('XTRIM', KEYS[1], 'MINID', cursor)
elseif rewrite_cursor then
    redis.call('HSET', KEYS[2], 'score', ms(last_score))
end
if size >= capacity then
    return {'FULL', size}
end
return {'OK', #messages}
