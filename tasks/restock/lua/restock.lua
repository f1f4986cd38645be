-- Return the stock of a batch of due delay-queue entries of one queue.
--
-- KEYS[1]  lease:{stock:N}:maintenance  exists while the shard is being rebuilt
-- KEYS[2]  lease:{stock:N}:drain:QUEUE   the queue drainer's lease token (lease package)
-- KEYS[3]  term:{stock:N}              the shard's current term (missing: 0)
-- KEYS[4]  offsets:{stock:N}:QUEUE     hash sku_id -> offset of the last entry applied
-- KEYS[5]  stock:{stock:N}             hash sku_id -> available quantity
-- KEYS[6]  deducted:{stock:N}          hash order_item_id -> entry text (deduction on record)
-- KEYS[7]  delay:{stock:N}:QUEUE       sorted set of pending entries
-- KEYS[8]  drain-attempts:{stock:N}:QUEUE  hash member -> drain attempts (tasks.restock.drain)
-- ARGV[1]  token   the caller's drain-lock token
-- ARGV[2]  paid    one character per entry, '1' paid or '0' not (from the database)
-- ARGV[3 ..]       the entries' texts, one per entry, in offset order; each one the caller
--                  validated (tasks.restock.redolog.parse_entry), so the script only splits it
--                  (orderItemId:redisId:queue:offset:skuId:skuNum:time:redisTerm:memberId).
-- Two arguments per batch and one per entry: packing and sending seven per entry was a third
-- of a drain batch's client time.
--
-- Returns one status per entry, in order:
--   'MAINTAINING'        shard in maintenance: nothing done for any entry (abort the batch)
--   'LOCK_FAILED'        drain lease not held by token: nothing done (abort, re-acquire)
--   'WRONG_TERM'         entry from an older term (the rebuild already counted it): removed
--                        (the drainer, seeing the term in take.lua, left its item alone)
--   'HAS_BEEN_CONSUMED'  offset not above the SKU's stored offset and the entry is not the
--                        deduction on record: removed, no stock change
--   'PAID'               paid, and the deduction on record is this entry: offset stored,
--                        removed, no stock change
--   'SUCCESS'            stock += sku_num, offset stored, removed
--   'FAILED:<reason>'    the entry could not be applied (its stock value is not an integer,
--                        or would overflow; its stored offset is not a number; its text
--                        does not split into the nine fields of an entry): nothing
--                        changed for it, it stays queued (the drainer counts a failed attempt)
-- An error reply (WRONGTYPE) when a key it writes holds another type: nothing changed at all.
-- A paid order whose record is a different entry still gets this entry's stock back.
-- Whatever the status, the entry leaves the delay queue with its attempt count, and the
-- deduction on record goes too when it is this entry: the item's stock is settled (back, or
-- sold), so nothing reads the record again (a re-issued item's record is its newer entry, kept
-- until that one is consumed). This is what keeps deducted:{stock:N} bounded by the pending
-- items instead of growing with every order.
-- An entry that is still the deduction on record was never consumed (whatever consumes an
-- entry takes its record along, and an entry text is never issued twice), so it is not
-- HAS_BEEN_CONSUMED even below the stored offset: entries that became due out of offset order
-- (a re-queued or re-scored member) lose nothing. The stored offset only grows.
-- Maintenance and the lock are checked once: nothing inside one script call can change them.
-- Nothing raises after the first write: Redis does not roll a script back, so an error half-way
-- would leave the entries before it applied (stock back, removed) while the caller, seeing only
-- the error, could not tell which. So the types of the keys written are checked before any
-- write, each entry's reads are checked before its writes, and the one write that can refuse
-- a value (HINCRBY) is the entry's first and runs under pcall: an entry that cannot be applied
-- is reported FAILED with nothing written for it, and the rest of the batch goes on.
local n = #ARGV - 2
local ENTRY = '^([^:]+):[^:]+:[^:]+:([^:]+):([^:]+):([^:]+):[^:]+:([^:]+):[^:]+$'
local statuses = {}
local abort
if redis.call('EXISTS', KEYS[1]) == 1 then
    abort = 'MAINTAINING'
elseif redis.call('GET', KEYS[2]) ~= ARGV[1] then
    abort = 'LOCK_FAILED'
end
if abort then
    for k = 1, n do statuses[k] = abort end
    return statuses
end
for k, want in pairs({[4] = 'hash', [5] = 'hash', [6] = 'hash', [7] = 'zset', [8] = 'hash'}) do
    local found = redis.call('TYPE', KEYS[k])['ok']
    if found ~= want and found ~= 'none' then
        return redis.error_reply('WRONGTYPE ' .. KEYS[k] .. ' holds a ' .. found ..
                                 ', not a ' .. want .. ': nothing restocked')
    end
end
local term = redis.call('GET', KEYS[3]) or '0'
for k = 1, n do
    local entry = ARGV[2 + k]
    local order_item, offset, sku, qty, entry_term = string.match(entry, ENTRY)
    offset, qty = tonumber(offset), tonumber(qty)
    local raw, stored, on_record
    if offset and qty then
        raw = redis.call('HGET', KEYS[4], sku)
        stored = tonumber(raw or '0')
        on_record = redis.call('HGET', KEYS[6], order_item) == entry
    end
    local status, failed
    if not (offset and qty) then
        failed = 'not an entry: ' .. string.sub(entry, 1, 64)
    elseif stored == nil then
        failed = 'the restocked offset of ' .. sku .. ' is not a number: ' .. string.sub(raw, 1, 64)
    elseif entry_term ~= term then
        status = 'WRONG_TERM'
    elseif offset <= stored and not on_record then
        status = 'HAS_BEEN_CONSUMED'
    elseif string.sub(ARGV[2], k, k) == '1' and on_record then
        -- Stored like a restock: a later copy of this entry (its record is gone by then)
        -- meets HAS_BEEN_CONSUMED, not the restock of an unrecorded entry.
        status = 'PAID'
    else
        local added = redis.pcall('HINCRBY', KEYS[5], sku, qty)
        if type(added) == 'table' and added.err then
            failed = added.err
        else
            status = 'SUCCESS'
        end
    end
    if failed then
        status = 'FAILED:' .. failed
    else
        if (status == 'PAID' or status == 'SUCCESS') and offset > stored then
            redis.call('HSET', KEYS[4], sku, offset)
        end
        redis.call('ZREM', KEYS[7], entry)
        redis.call('HDEL', KEYS[8], entry)
        if on_record then
            redis.call('HDEL', KEYS[6], order_item)
        end
    end
    statuses[k] = status
end
return statuses
