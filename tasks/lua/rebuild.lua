-- Rewrite a node's stock from the database during its maintenance window (seed 002).
--
-- tasks.maintenance calls it in chunks while it holds the node's maintenance lease; every
-- other stock script refuses while that lease exists, so the chunks need no atomicity between
-- them. Each chunk checks the lease token first.
--
-- KEYS[1]  lease:{node:N}:maintenance   the rebuilder's lease token
-- KEYS[2]  stock:{node:N}               hash sku_id -> available quantity
-- KEYS[3]  term:{node:N}                the node's term
-- KEYS[4]  deducted:{node:N}            hash order_item_id -> entry text (deduction on record)
-- KEYS[5 + 2q], KEYS[6 + 2q]            for each queue q = 0, 1, ...: redo:{node:N}:QUEUE
--                                       (stream) and offset:{node:N}:QUEUE (counter)
-- ARGV[1]  token    ARGV[2]  new term    ARGV[3]  redis_id (N)    ARGV[4]  s, stock pairs
-- ARGV[5 .. 4 + 2s]                     sku_id, quantity: the stock the database says is free
-- then 7 fields per order item still holding stock unpaid, to re-issue in the new term:
--          queue index q, queue name, order_item_id, sku_id, qty, time_ms, member_id
--
-- Returns {'OK', entry, ...}   the term is set, the stock written, and each item re-issued:
--                              a new offset, a new entry on record, the entry appended to its
--                              queue's redo log (with the original time, so the delay does
--                              not restart). The old entries now meet WRONG_TERM.
--         {'LOCK_FAILED'}      the maintenance lease is not held by token: nothing changed
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return {'LOCK_FAILED'}
end
local term = ARGV[2]
redis.call('SET', KEYS[3], term)
local pairs_end = 4 + 2 * tonumber(ARGV[4])
for i = 5, pairs_end, 2 do
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
local reply = {'OK'}
for base = pairs_end + 1, #ARGV, 7 do
    local q = tonumber(ARGV[base])
    local redo, offset_key = KEYS[5 + 2 * q], KEYS[6 + 2 * q]
    local offset = redis.call('INCR', offset_key)
    local entry = table.concat({ARGV[base + 2], ARGV[3], ARGV[base + 1], offset, ARGV[base + 3],
                                ARGV[base + 4], ARGV[base + 5], term, ARGV[base + 6]}, ':')
    redis.call('HSET', KEYS[4], ARGV[base + 2], entry)
    redis.call('XADD', redo, '*', 'e', entry, 't', ARGV[base + 5])
    reply[#reply + 1] = entry
end
return reply
