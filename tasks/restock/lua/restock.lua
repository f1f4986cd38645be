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
-- ARGV[2 + 7k .. 8 + 7k], for each entry k, as parsed by tasks.restock.redolog.parse_entry:
--          entry text, order_item_id, sku_id, sku_num, offset, term, paid ('1' or '0', from
--          the database)
-- The caller passes entries in offset order.
--
-- Returns one status per entry, in order:
--   'MAINTAINING'        shard in maintenance: nothing done for any entry (abort the batch)
--   'LOCK_FAILED'        drain lease not held by token: nothing done (abort, re-acquire)
--   'WRONG_TERM'         entry from an older term (the rebuild already counted it): removed
--   'HAS_BEEN_CONSUMED'  offset not above the SKU's stored offset and the entry is not the
--                        deduction on record: removed, no stock change
--   'PAID'               paid, and the deduction on record is this entry: offset stored,
--                        removed, no stock change
--   'SUCCESS'            stock += sku_num, offset stored, removed
--   'FAILED:<reason>'    the entry could not be applied (its stock value is not an integer,
--                        or would overflow; its stored offset is not a number): nothing
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
local n = (#ARGV - 1) / 7
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
    local base = 2 + 7 * (k - 1)
    local entry, order_item, sku = ARGV[base], ARGV[base + 1], ARGV[base + 2]
    local qty, offset = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
    local raw = redis.call('HGET', KEYS[4], sku)
    local stored = tonumber(raw or '0')
    local on_record = redis.call('HGET', KEYS[6], order_item) == entry
    local status, failed
    if stored == nil then
        failed = 'the restocked offset of ' .. sku .. ' is not a number: ' .. string.sub(raw, 1, 64)
    elseif ARGV[base + 5] ~= term then
        status = 'WRONG_TERM'
    elseif offset <= stored and not on_record then
        status = 'HAS_BEEN_CONSUMED'
    elseif ARGV[base + 6] == '1' and on_record then
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
