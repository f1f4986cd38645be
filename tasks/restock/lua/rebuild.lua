-- Rewrite a shard's stock from the database during its maintenance window.
--
-- tasks.restock.maintenance calls it in chunks while it holds the shard's maintenance lease;
-- every other stock script refuses while that lease exists, so the chunks need no atomicity
-- between them. Each chunk checks the lease token first.
--
-- KEYS[1]  lease:{stock:N}:maintenance   the rebuilder's lease token
-- KEYS[2]  stock:{stock:N}               hash sku_id -> available quantity
-- KEYS[3]  term:{stock:N}                the shard's term
-- KEYS[4]  deducted:{stock:N}            hash order_item_id -> entry text (deduction on record)
-- KEYS[5]  offset:{stock:N}              the shard's offset counter
-- KEYS[6 + 2q], KEYS[7 + 2q]            for each queue q = 0, 1, ...: redo:{stock:N}:QUEUE
--                                       (stream) and offsets:{stock:N}:QUEUE (restocked offsets)
-- ARGV[1]  token    ARGV[2]  new term    ARGV[3]  shard (N)
-- ARGV[4]  min_offset: the highest offset the database recorded for the shard
-- ARGV[5]  s, stock pairs;  ARGV[6 .. 5 + 2s]: sku_id, quantity (the free stock per database)
-- then 7 fields per order item still holding stock unpaid, to re-issue in the new term:
--          queue index q, queue name, order_item_id, sku_id, qty, time_ms, member_id
--
-- Returns {'OK', entry, ...}   the term is set, the stock written, and each item re-issued:
--                              a new offset, a new entry on record, the entry appended to its
--                              queue's redo log (with the original time, so the delay does
--                              not restart). The old entries now meet WRONG_TERM.
--         {'LOCK_FAILED'}      the maintenance lease is not held by token: nothing changed
-- The offset counter is raised to at least min_offset, so a shard that came back older than
-- the database (it refused deductions as STALE) is level with it again and never hands out an
-- offset twice. The restocked offsets are per term (older entries meet WRONG_TERM before the
-- offset check), so the new term starts them afresh.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return {'LOCK_FAILED'}
end
local term = ARGV[2]
redis.call('SET', KEYS[3], term)
if tonumber(redis.call('GET', KEYS[5]) or '0') < tonumber(ARGV[4]) then
    redis.call('SET', KEYS[5], ARGV[4])
end
for k = 7, #KEYS, 2 do
    redis.call('DEL', KEYS[k])
end
local pairs_end = 5 + 2 * tonumber(ARGV[5])
for i = 6, pairs_end, 2 do
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
local reply = {'OK'}
for base = pairs_end + 1, #ARGV, 7 do
    local q = tonumber(ARGV[base])
    local offset = redis.call('INCR', KEYS[5])
    local entry = table.concat({ARGV[base + 2], ARGV[3], ARGV[base + 1], offset, ARGV[base + 3],
                                ARGV[base + 4], ARGV[base + 5], term, ARGV[base + 6]}, ':')
    redis.call('HSET', KEYS[4], ARGV[base + 2], entry)
    redis.call('XADD', KEYS[6 + 2 * q], '*', 'e', entry, 't', ARGV[base + 5])
    reply[#reply + 1] = entry
end
return reply
