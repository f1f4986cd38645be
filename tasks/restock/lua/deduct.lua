-- Deduct stock for one order item and append its redo-log entry.
--
-- KEYS[1]  stock:{stock:N}            hash sku_id -> available quantity
-- KEYS[2]  deducted:{stock:N}         hash order_item_id -> entry text (the deduction on record)
-- KEYS[3]  redo:{stock:N}:QUEUE       stream, one message {e = entry text, t = time_ms} per deduction
-- KEYS[4]  term:{stock:N}             integer, the shard's current term (missing: 0)
-- KEYS[5]  offset:{stock:N}           integer counter, the shard's last offset (missing: 0)
-- KEYS[6]  lease:{stock:N}:maintenance exists while the shard is being rebuilt
-- ARGV[1]  order_item_id   ARGV[2] sku_id   ARGV[3] qty
-- ARGV[4]  now: '' = the shard's clock (Redis TIME); a test's shared fake shard clock otherwise
-- ARGV[5]  member_id       ARGV[6] queue    ARGV[7] shard (N)
-- ARGV[8]  max_qty (redolog.MAX_SKU_NUM)
-- ARGV[9]  min_term, ARGV[10] min_offset: the shard's generation as the database knows it (the
--          last term a rebuild handed out, the highest offset an order item recorded)
--
-- Returns {'OK', entry}            deducted; entry is the new redo-log entry text
--         {'MAINTAINING', ''}      the shard is being rebuilt: nothing changes, try again later
--         {'STALE', 'term/offset'} the shard is older than the database (restarted from an older
--                                  snapshot, a lagging replica, or empty): nothing changes
--                                  until a rebuild brings it up to date
--         {'BAD_QUANTITY', qty}    qty is not a decimal integer in 1..max_qty
--         {'DUPLICATE', entry}     this order item was already deducted: the stored entry, no change
--         {'UNKNOWN_SKU', sku}     no such SKU on this shard
--         {'INSUFFICIENT', stock}  fewer than qty left; nothing changes
-- DUPLICATE is checked before the SKU and the stock, so a retried deduction always gets its
-- original entry back, even after the stock ran out. A deduction during maintenance would race
-- the rebuild's recount of the stock, so none happens then. The entry's time is the shard's
-- clock: every due time of the shard is measured on that one clock, never a worker's.
if redis.call('EXISTS', KEYS[6]) == 1 then
    return {'MAINTAINING', ''}
end
local term = redis.call('GET', KEYS[4]) or '0'
local offset = tonumber(redis.call('GET', KEYS[5]) or '0')
if tonumber(term) < tonumber(ARGV[9]) or offset < tonumber(ARGV[10]) then
    return {'STALE', term .. '/' .. offset}
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
local now = ARGV[4]
if now == '' then
    local time = redis.call('TIME')
    now = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
end
redis.call('HINCRBY', KEYS[1], ARGV[2], -qty)
offset = redis.call('INCR', KEYS[5])
local entry = table.concat({ARGV[1], ARGV[7], ARGV[6], offset, ARGV[2], qty_text, now, term,
                            ARGV[5]}, ':')
redis.call('HSET', KEYS[2], ARGV[1], entry)
redis.call('XADD', KEYS[3], '*', 'e', entry, 't', now)
return {'OK', entry}
