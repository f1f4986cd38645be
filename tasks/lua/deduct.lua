-- Deduct stock for one order item and append its redo-log entry (seed 002).
--
-- KEYS[1]  stock:{node:N}            hash sku_id -> available quantity
-- KEYS[2]  deducted:{node:N}         hash order_item_id -> entry text (the deduction on record)
-- KEYS[3]  redo:{node:N}:QUEUE       stream, one message {e = entry text, t = time_ms} per deduction
-- KEYS[4]  term:{node:N}             integer, the node's current term (missing: 0)
-- KEYS[5]  offset:{node:N}:QUEUE     integer counter, the queue's last offset
-- KEYS[6]  lease:{node:N}:maintenance exists while the node is being rebuilt
-- ARGV[1]  order_item_id   ARGV[2] sku_id   ARGV[3] qty   ARGV[4] time_ms   ARGV[5] member_id
-- ARGV[6]  queue           ARGV[7] redis_id (N)          ARGV[8] max_qty (redolog.MAX_SKU_NUM)
--
-- Returns {'OK', entry}            deducted; entry is the new redo-log entry text
--         {'MAINTAINING', ''}      the node is being rebuilt: nothing changes, try again later
--         {'BAD_QUANTITY', qty}    qty is not a decimal integer in 1..max_qty
--         {'DUPLICATE', entry}     this order item was already deducted: the stored entry, no change
--         {'UNKNOWN_SKU', sku}     no such SKU on this node
--         {'INSUFFICIENT', stock}  fewer than qty left; nothing changes
-- DUPLICATE is checked before the SKU and the stock, so a retried deduction always gets its
-- original entry back, even after the stock ran out. A deduction during maintenance would race
-- the rebuild's recount of the stock, so none happens then.
if redis.call('EXISTS', KEYS[6]) == 1 then
    return {'MAINTAINING', ''}
end
local qty_text = ARGV[3]
if not string.match(qty_text, '^[1-9][0-9]*$') or #qty_text > 15
        or tonumber(qty_text) > tonumber(ARGV[8]) then
    return {'BAD_QUANTITY', qty_text}
end
local qty = tonumber(qty_text)
local previous = redis.call('HGET', KEYS[2], ARGV[1])
if previous then
    return {'DUPLICATE', previous}
end
local stock = redis.call('HGET', KEYS[1], ARGV[2])
if not stock then
    return {'UNKNOWN_SKU', ARGV[2]}
end
if tonumber(stock) < qty then
    return {'INSUFFICIENT', stock}
end
redis.call('HINCRBY', KEYS[1], ARGV[2], -qty)
local offset = redis.call('INCR', KEYS[5])
local term = redis.call('GET', KEYS[4]) or '0'
local entry = table.concat({ARGV[1], ARGV[7], ARGV[6], offset, ARGV[2], qty_text, ARGV[4], term,
                            ARGV[5]}, ':')
redis.call('HSET', KEYS[2], ARGV[1], entry)
redis.call('XADD', KEYS[3], '*', 'e', entry, 't', ARGV[4])
return {'OK', entry}
