"""deduct.lua, sync.lua, take.lua, restock.lua, discard.lua and rebuild.lua (and the tests'
due.lua view) against a real private Redis: every reply code. A fake node clock stands for the
node's Redis TIME."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest
import redis

from tasks.restock.keys import (
    attempts_key,
    deduct_keys,
    deducted_key,
    delay_key,
    drain_lock_key,
    maintaining_key,
    offset_key,
    offsets_key,
    redo_cursor_key,
    redo_key,
    stock_key,
    term_key,
)
from tasks.restock.redolog import MAX_SKU_NUM, RedoEntry, format_entry, parse_entry
from tasks.restock.replies import (
    ACTIONS,
    HAS_BEEN_CONSUMED,
    PAID,
    STALE,
    SUCCESS,
    WRONG_TERM,
    Action,
    BadQuantity,
    InsufficientStock,
    LockNotHeld,
    NodeMaintaining,
    NodeStale,
    QueueFull,
    UnknownSku,
)
from tasks.restock.scripts import DEFAULT_DELAY_MS, Generation, Reissue, StockScripts, Taken
from tests.restock.conftest import FakeClockMs
from tests.restock.due import due
from tests.support.redis_server import RedisServer

NODE = 3
QUEUE = "q1"
T0 = 1_700_000_000_000
TOKEN = "a" * 32


@pytest.fixture
def client(private_redis: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(port=private_redis.port)
    yield c
    c.close()


@pytest.fixture
def clock() -> FakeClockMs:
    return FakeClockMs(T0)


@pytest.fixture
def scripts(client: redis.Redis, clock: FakeClockMs) -> StockScripts:
    client.hset(stock_key(NODE), mapping={"sku-a": 10, "sku-b": 5})
    return StockScripts(client, clock)


def stock(client: redis.Redis, sku: str = "sku-a") -> int:
    return int(client.hget(stock_key(NODE), sku) or 0)


def deduct(scripts: StockScripts, order_item: str, qty: int = 2, sku: str = "sku-a",
           time_ms: int = T0) -> RedoEntry:
    """Deduct at node time `time_ms`."""
    assert isinstance(scripts.clock, FakeClockMs)
    scripts.clock.now = time_ms
    return scripts.deduct(NODE, QUEUE, order_item, sku, qty, "m-1").entry


def due_at(scripts: StockScripts, now_ms: int) -> list[RedoEntry]:
    assert isinstance(scripts.clock, FakeClockMs)
    scripts.clock.now = now_ms
    return [parse_entry(m) for m in due(scripts, NODE, QUEUE)]


def queued(scripts: StockScripts, *order_items: str) -> list[RedoEntry]:
    """Deduct for each order item, sync them all and take the drain lock."""
    entries = [deduct(scripts, oi) for oi in order_items]
    assert scripts.sync(NODE, QUEUE) == len(entries)
    scripts.client.set(drain_lock_key(NODE, QUEUE), TOKEN)
    return entries


def in_delay_queue(client: redis.Redis, entry: RedoEntry) -> bool:
    return client.zscore(delay_key(NODE, QUEUE), format_entry(entry)) is not None


# --- deduct ---------------------------------------------------------------------------------


def test_deduct_ok_records_the_entry(scripts: StockScripts, client: redis.Redis) -> None:
    client.set(term_key(NODE), 4)
    result = scripts.deduct(NODE, QUEUE, "oi-1", "sku-a", 3, "m-1")
    assert not result.duplicate
    assert result.entry == RedoEntry(order_item_id="oi-1", redis_id=NODE, queue=QUEUE, offset=1,
                                     sku_id="sku-a", sku_num=3, time_ms=T0, term=4,
                                     member_id="m-1")
    assert stock(client) == 7
    text = format_entry(result.entry)
    assert client.hget(deducted_key(NODE), "oi-1") == text.encode()
    [(_id, fields)] = client.xrange(redo_key(NODE, QUEUE))
    assert fields == {b"e": text.encode(), b"t": str(T0).encode()}
    assert deduct(scripts, "oi-2").offset == 2


def test_deduct_unknown_sku(scripts: StockScripts, client: redis.Redis) -> None:
    with pytest.raises(UnknownSku) as info:
        deduct(scripts, "oi-1", sku="nope")
    assert info.value.code == "UNKNOWN_SKU"
    assert client.hget(stock_key(NODE), "nope") is None
    assert client.xlen(redo_key(NODE, QUEUE)) == 0


@pytest.mark.parametrize("qty", [0, -1, MAX_SKU_NUM + 1, 10**20])
def test_deduct_bad_quantity(scripts: StockScripts, client: redis.Redis, qty: int) -> None:
    with pytest.raises(BadQuantity):
        deduct(scripts, "oi-1", qty=qty)
    assert stock(client) == 10
    assert client.hlen(deducted_key(NODE)) == 0


@pytest.mark.parametrize("qty", ["1.5", "1e1", "0x2", " 2", ""])
def test_deduct_script_refuses_non_decimal_quantity(
    scripts: StockScripts, client: redis.Redis, qty: str
) -> None:
    reply = scripts.run(scripts.deduct_script, deduct_keys(NODE, QUEUE),
                        ["oi-1", "sku-a", qty, T0, "m-1", QUEUE, NODE, MAX_SKU_NUM, 0, 0])
    assert reply[0] == b"BAD_QUANTITY"
    assert stock(client) == 10


def test_deduct_duplicate_returns_the_stored_entry(
    scripts: StockScripts, client: redis.Redis
) -> None:
    first = scripts.deduct(NODE, QUEUE, "oi-1", "sku-a", 3, "m-1")
    again = scripts.deduct(NODE, QUEUE, "oi-1", "sku-a", 5, "m-1")
    assert again.duplicate and again.entry == first.entry
    assert stock(client) == 7
    assert client.xlen(redo_key(NODE, QUEUE)) == 1


def test_deduct_insufficient(scripts: StockScripts, client: redis.Redis) -> None:
    with pytest.raises(InsufficientStock) as info:
        deduct(scripts, "oi-1", qty=11)
    assert info.value.detail == "10"
    assert stock(client) == 10
    assert client.xlen(redo_key(NODE, QUEUE)) == 0


def test_stock_never_goes_negative(scripts: StockScripts, client: redis.Redis) -> None:
    rng = random.Random(2)
    taken = 0
    for i in range(200):
        try:
            taken += deduct(scripts, f"oi-{i}", qty=rng.randint(1, 4)).sku_num
        except InsufficientStock:
            pass
        assert stock(client) >= 0
    assert stock(client) == 10 - taken


# --- sync -----------------------------------------------------------------------------------


def test_sync_ok_moves_entries_once(scripts: StockScripts, client: redis.Redis) -> None:
    entries = [deduct(scripts, f"oi-{i}", qty=1, time_ms=T0 + 10 * i) for i in range(3)]
    assert scripts.sync(NODE, QUEUE, count=2) == 2
    assert scripts.sync(NODE, QUEUE, count=2) == 1
    assert scripts.sync(NODE, QUEUE) == 0
    scores = client.zrange(delay_key(NODE, QUEUE), 0, -1, withscores=True)
    assert scores == [(format_entry(e).encode(), float(e.time_ms + DEFAULT_DELAY_MS))
                      for e in entries]
    # Synced entries are trimmed from the log; the last one stays as the cursor's anchor.
    assert client.xlen(redo_key(NODE, QUEUE)) == 1
    assert due_at(scripts, T0 + DEFAULT_DELAY_MS + 10) == entries[:2]


def test_sync_scores_follow_offset_order_despite_clock_skew(
    scripts: StockScripts, client: redis.Redis
) -> None:
    late = deduct(scripts, "oi-1", time_ms=T0 + 5000)
    early = deduct(scripts, "oi-2", time_ms=T0)
    scripts.sync(NODE, QUEUE)
    assert due_at(scripts, 2 * T0) == [late, early]


def test_sync_maintaining(scripts: StockScripts, client: redis.Redis) -> None:
    deduct(scripts, "oi-1")
    client.set(maintaining_key(NODE), 1)
    with pytest.raises(NodeMaintaining):
        scripts.sync(NODE, QUEUE)
    assert client.zcard(delay_key(NODE, QUEUE)) == 0
    client.delete(maintaining_key(NODE))
    assert scripts.sync(NODE, QUEUE) == 1


def test_sync_full_leaves_entries_in_the_log(scripts: StockScripts, client: redis.Redis) -> None:
    entries = [deduct(scripts, f"oi-{i}", qty=1) for i in range(3)]
    assert scripts.sync(NODE, QUEUE, capacity=2) == 2
    cursor = client.hgetall(redo_cursor_key(NODE, QUEUE))
    with pytest.raises(QueueFull) as info:
        scripts.sync(NODE, QUEUE, capacity=2)
    assert info.value.detail == "2"
    assert client.hgetall(redo_cursor_key(NODE, QUEUE)) == cursor
    assert client.xlen(redo_key(NODE, QUEUE)) == 2  # the cursor's anchor and the refused one
    assert not in_delay_queue(client, entries[2])
    client.zrem(delay_key(NODE, QUEUE), format_entry(entries[0]))
    assert scripts.sync(NODE, QUEUE, capacity=2) == 1
    assert in_delay_queue(client, entries[2])


def test_sync_after_a_cursor_reset_keeps_every_entry_in_offset_order(
    scripts: StockScripts, client: redis.Redis
) -> None:
    """A reset cursor (a redelivery) re-syncs what the log still holds: a queued entry keeps
    its due time, and an entry new to the queue is due after every entry queued before it."""
    entries = [deduct(scripts, f"oi-{i}", qty=1) for i in range(3)]  # one time: scores +1
    assert scripts.sync(NODE, QUEUE) == 3
    before = client.zrange(delay_key(NODE, QUEUE), 0, -1, withscores=True)
    client.delete(redo_cursor_key(NODE, QUEUE))
    newer = deduct(scripts, "oi-3", qty=1)
    assert scripts.sync(NODE, QUEUE) == 2  # the cursor's anchor (oi-2) again, and oi-3
    after = client.zrange(delay_key(NODE, QUEUE), 0, -1, withscores=True)
    assert after[:3] == before
    assert after[3][0] == format_entry(newer).encode() and after[3][1] > before[-1][1]
    assert due_at(scripts, T0 + DEFAULT_DELAY_MS + 2) == entries  # never oi-2 before oi-1


# --- restock --------------------------------------------------------------------------------


def test_restock_success(scripts: StockScripts, client: redis.Redis) -> None:
    a, b = queued(scripts, "oi-1", "oi-2")
    assert stock(client) == 6
    results = scripts.restock(NODE, QUEUE, TOKEN, [(b, False), (a, False)])
    assert [(r.entry, r.status, r.action) for r in results] == [
        (a, SUCCESS, Action.RESTOCKED), (b, SUCCESS, Action.RESTOCKED)]
    assert stock(client) == 10
    assert client.hget(offsets_key(NODE, QUEUE), "sku-a") == b"2"
    assert client.zcard(delay_key(NODE, QUEUE)) == 0


def test_restock_twice_changes_stock_once(scripts: StockScripts, client: redis.Redis) -> None:
    [a] = queued(scripts, "oi-1")
    assert scripts.restock(NODE, QUEUE, TOKEN, [(a, False)])[0].status == SUCCESS
    [again] = scripts.restock(NODE, QUEUE, TOKEN, [(a, False)])
    assert (again.status, again.action) == (HAS_BEEN_CONSUMED, Action.SKIPPED)
    assert stock(client) == 10


def test_restock_has_been_consumed_removes_the_entry(
    scripts: StockScripts, client: redis.Redis
) -> None:
    [a] = queued(scripts, "oi-1")
    # What consuming it left behind: its offset stored, its record gone.
    client.hset(offsets_key(NODE, QUEUE), "sku-a", a.offset)
    client.hdel(deducted_key(NODE), "oi-1")
    [result] = scripts.restock(NODE, QUEUE, TOKEN, [(a, False)])
    assert result.status == HAS_BEEN_CONSUMED
    assert stock(client) == 8
    assert not in_delay_queue(client, a)


def test_restock_out_of_offset_order_loses_no_entry(
    scripts: StockScripts, client: redis.Redis
) -> None:
    """A higher offset restocked first (its own batch) does not make a lower one, still on
    record, HAS_BEEN_CONSUMED; the stored offset stays the highest; a copy is consumed once."""
    low, paid, high = queued(scripts, "oi-1", "oi-2", "oi-3")
    assert scripts.restock(NODE, QUEUE, TOKEN, [(high, False)])[0].status == SUCCESS
    results = scripts.restock(NODE, QUEUE, TOKEN, [(low, False), (paid, True)])
    assert [r.status for r in results] == [SUCCESS, PAID]
    assert stock(client) == 8  # 10 - 3 * 2 + 2 * 2: oi-2's units are sold
    assert client.hget(offsets_key(NODE, QUEUE), "sku-a") == str(high.offset).encode()
    again = scripts.restock(NODE, QUEUE, TOKEN, [(low, False), (paid, False), (high, False)])
    assert [r.status for r in again] == [HAS_BEEN_CONSUMED] * 3
    assert stock(client) == 8 and client.hlen(deducted_key(NODE)) == 0


def test_restock_maintaining_aborts_the_batch(
    scripts: StockScripts, client: redis.Redis
) -> None:
    a, b = queued(scripts, "oi-1", "oi-2")
    client.set(maintaining_key(NODE), 1)
    with pytest.raises(NodeMaintaining):
        scripts.restock(NODE, QUEUE, TOKEN, [(a, False), (b, False)])
    assert stock(client) == 6
    assert in_delay_queue(client, a) and in_delay_queue(client, b)


@pytest.mark.parametrize("holder", [None, "b" * 32])
def test_restock_lock_failed_aborts_the_batch(
    scripts: StockScripts, client: redis.Redis, holder: str | None
) -> None:
    a, b = queued(scripts, "oi-1", "oi-2")
    client.delete(drain_lock_key(NODE, QUEUE))
    if holder:
        client.set(drain_lock_key(NODE, QUEUE), holder)
    with pytest.raises(LockNotHeld):
        scripts.restock(NODE, QUEUE, TOKEN, [(a, False), (b, False)])
    assert stock(client) == 6
    assert in_delay_queue(client, a) and in_delay_queue(client, b)
    assert ACTIONS["LOCK_FAILED"] is Action.REACQUIRE


def test_restock_wrong_term_is_consumed(scripts: StockScripts, client: redis.Redis) -> None:
    [a] = queued(scripts, "oi-1")
    client.set(term_key(NODE), a.term + 1)
    [result] = scripts.restock(NODE, QUEUE, TOKEN, [(a, False)])
    assert (result.status, result.action) == (WRONG_TERM, Action.SKIPPED)
    assert stock(client) == 8
    assert not in_delay_queue(client, a)


def test_restock_paid_same_entry_is_removed_without_restock(
    scripts: StockScripts, client: redis.Redis
) -> None:
    [a] = queued(scripts, "oi-1")
    [result] = scripts.restock(NODE, QUEUE, TOKEN, [(a, True)])
    assert (result.status, result.action) == (PAID, Action.SKIPPED)
    assert stock(client) == 8
    assert not in_delay_queue(client, a)


def test_restock_paid_but_another_entry_on_record_restocks(
    scripts: StockScripts, client: redis.Redis
) -> None:
    [a] = queued(scripts, "oi-1")
    other = parse_entry(client.hget(deducted_key(NODE), "oi-1") or b"")
    client.hset(deducted_key(NODE), "oi-1",
                format_entry(dataclasses.replace(other, offset=other.offset + 100)))
    [result] = scripts.restock(NODE, QUEUE, TOKEN, [(a, True)])
    assert result.status == SUCCESS
    assert stock(client) == 10


def test_restock_mixed_batch(scripts: StockScripts, client: redis.Redis) -> None:
    a, b, c = queued(scripts, "oi-1", "oi-2", "oi-3")
    results = scripts.restock(NODE, QUEUE, TOKEN, [(a, False), (b, True), (c, False)])
    assert [r.status for r in results] == [SUCCESS, PAID, SUCCESS]
    assert stock(client) == 8
    assert client.zcard(delay_key(NODE, QUEUE)) == 0


def test_every_reply_code_has_one_action() -> None:
    codes = {"OK", "UNKNOWN_SKU", "BAD_QUANTITY", "DUPLICATE", "INSUFFICIENT", "MAINTAINING",
             "STALE", "FULL", "SUCCESS", "LOCK_FAILED", "WRONG_TERM", "HAS_BEEN_CONSUMED",
             "PAID", "FAILED"}
    assert set(ACTIONS) == codes


def test_deduct_refused_during_maintenance(scripts: StockScripts, client: redis.Redis) -> None:
    client.set(maintaining_key(NODE), "rebuilder")
    with pytest.raises(NodeMaintaining):
        deduct(scripts, "oi-m")
    assert stock(client) == 10
    assert client.xlen(redo_key(NODE, QUEUE)) == 0
    client.delete(maintaining_key(NODE))
    assert deduct(scripts, "oi-m").sku_num == 2


def test_sync_queues_a_message_without_entry_as_malformed(
    scripts: StockScripts, client: redis.Redis
) -> None:
    """A message deduct.lua did not write neither blocks the log nor vanishes."""
    bad_id = client.xadd(redo_key(NODE, QUEUE), {"x": "junk"}).decode()
    client.xadd(redo_key(NODE, QUEUE), {"e": "not:an:entry", "t": "soon"})
    good = deduct(scripts, "oi-after")
    assert scripts.sync(NODE, QUEUE) == 3
    members = [m.decode() for m in client.zrange(delay_key(NODE, QUEUE), 0, -1)]
    assert members == [f"MALFORMED:{bad_id}", "not:an:entry", format_entry(good)]


def test_take_counts_an_attempt_at_each_due_member_in_due_order(
    scripts: StockScripts, client: redis.Redis
) -> None:
    early, late = (deduct(scripts, oi, time_ms=T0 + i) for i, oi in enumerate(("oi-1", "oi-2")))
    later = deduct(scripts, "oi-3", time_ms=T0 + 10_000)
    assert scripts.sync(NODE, QUEUE) == 3
    assert isinstance(scripts.clock, FakeClockMs)
    scripts.clock.now = T0 + DEFAULT_DELAY_MS + 5_000  # the first two are due, not the third
    taken = scripts.take(NODE, QUEUE, limit=10)
    assert taken == Taken(0, [(format_entry(early).encode(), 1),
                              (format_entry(late).encode(), 1)])
    assert client.hget(attempts_key(NODE, QUEUE), format_entry(later)) is None
    assert scripts.take(NODE, QUEUE, limit=1).members == [(format_entry(early).encode(), 2)]
    with pytest.raises(ValueError):
        scripts.take(NODE, QUEUE, limit=0)


def test_take_runs_a_member_counted_before_alone(scripts: StockScripts, client: redis.Redis
                                                 ) -> None:
    """A member an unfinished batch counted may be what killed it: it is taken alone, with
    its count going up, and nothing else is counted."""
    entries = queued(scripts, "oi-1", "oi-2", "oi-3")
    suspect = format_entry(entries[1]).encode()
    client.hset(attempts_key(NODE, QUEUE), suspect, 2)
    assert len(due_at(scripts, T0 + 2 * DEFAULT_DELAY_MS)) == 3
    assert scripts.take(NODE, QUEUE).members == [(suspect, 3)]
    assert client.hlen(attempts_key(NODE, QUEUE)) == 1
    scripts.restock(NODE, QUEUE, TOKEN, [(entries[1], False)])  # settled with its count
    assert [n for _, n in scripts.take(NODE, QUEUE).members] == [1, 1]


def test_take_returns_members_as_stored_and_nothing_when_none_is_due(
    scripts: StockScripts, client: redis.Redis
) -> None:
    assert scripts.take(NODE, QUEUE) == Taken(0, [])
    client.zadd(delay_key(NODE, QUEUE), {b"\xff\xfenot-utf8": T0})
    assert isinstance(scripts.clock, FakeClockMs)
    scripts.clock.now = T0
    assert scripts.take(NODE, QUEUE).members == [(b"\xff\xfenot-utf8", 1)]


def test_take_reads_the_shards_term_with_the_batch(scripts: StockScripts,
                                                  client: redis.Redis) -> None:
    """The drainer releases only the items of entries of this term (restock.lua drops the
    others as WRONG_TERM), so it comes from the same call as the batch."""
    entries = queued(scripts, "oi-1")
    client.set(term_key(NODE), 3)
    assert scripts.take(NODE, QUEUE) == Taken(3, [])  # nothing due yet: the term alone
    due_at(scripts, T0 + 2 * DEFAULT_DELAY_MS)
    assert scripts.take(NODE, QUEUE) == Taken(3, [(format_entry(entries[0]).encode(), 1)])


def test_discard_removes_only_for_the_lease_holder(
    scripts: StockScripts, client: redis.Redis
) -> None:
    (entry,) = queued(scripts, "oi-d")
    member = format_entry(entry)
    client.hset(attempts_key(NODE, QUEUE), member, 2)
    with pytest.raises(LockNotHeld):
        scripts.discard(NODE, QUEUE, "b" * 32, [member])
    assert in_delay_queue(client, entry)
    assert scripts.discard(NODE, QUEUE, TOKEN, [member, "absent"]) == 1
    assert not in_delay_queue(client, entry)
    assert client.hget(attempts_key(NODE, QUEUE), member) is None
    assert scripts.discard(NODE, QUEUE, TOKEN, []) == 0


def test_rebuild_sets_stock_and_term_and_reissues(
    scripts: StockScripts, client: redis.Redis
) -> None:
    old = deduct(scripts, "oi-r", qty=3)
    client.set(maintaining_key(NODE), "maint")
    item = Reissue(queue=QUEUE, order_item_id="oi-r", sku_id="sku-a", qty=3, time_ms=T0,
                   member_id="m-1")
    (new,) = scripts.rebuild(NODE, [QUEUE], "maint", Generation(7, 0),
                             [("sku-a", 4), ("sku-c", 9)], [item])
    assert int(client.get(term_key(NODE)) or 0) == 7
    assert stock(client) == 4 and stock(client, "sku-c") == 9
    assert stock(client, "sku-b") == 5  # SKUs the rebuild did not name are left alone
    assert (new.term, new.offset, new.time_ms, new.sku_num) == (7, old.offset + 1, T0, 3)
    assert client.hget(deducted_key(NODE), "oi-r") == format_entry(new).encode()
    log = client.xrange(redo_key(NODE, QUEUE))
    assert log[-1][1] == {b"e": format_entry(new).encode(), b"t": str(T0).encode()}
    client.delete(maintaining_key(NODE))
    # The old entry now meets WRONG_TERM; the re-issued one is restocked.
    assert scripts.sync(NODE, QUEUE) == 2
    client.set(drain_lock_key(NODE, QUEUE), TOKEN)
    results = scripts.restock(NODE, QUEUE, TOKEN, [(old, False), (new, False)])
    assert [r.status for r in results] == [WRONG_TERM, SUCCESS]
    assert stock(client) == 7
    assert client.hlen(deducted_key(NODE)) == 0  # the re-issued entry took its record along


def test_rebuild_refused_without_the_maintenance_lease(
    scripts: StockScripts, client: redis.Redis
) -> None:
    with pytest.raises(LockNotHeld):
        scripts.rebuild(NODE, [QUEUE], "maint", Generation(7, 0), [("sku-a", 1)], [])
    client.set(maintaining_key(NODE), "someone-else")
    with pytest.raises(LockNotHeld):
        scripts.rebuild(NODE, [QUEUE], "maint", Generation(7, 0), [("sku-a", 1)], [])
    assert stock(client) == 10 and client.get(term_key(NODE)) is None


# --- issue 9: one clock, one generation, bounded records --------------------------------------


def test_deduct_and_due_read_the_node_clock_when_none_is_injected(client: redis.Redis) -> None:
    client.hset(stock_key(NODE), "sku-a", 10)
    scripts = StockScripts(client)  # production: Redis TIME inside the scripts
    seconds, micros = client.time()
    before = int(seconds) * 1000 + int(micros) // 1000
    entry = scripts.deduct(NODE, QUEUE, "oi-1", "sku-a", 1, "m-1").entry
    assert before <= entry.time_ms <= scripts.now_ms()
    assert scripts.sync(NODE, QUEUE, delay_ms=0) == 1
    assert due(scripts, NODE, QUEUE) == [format_entry(entry).encode()]
    assert scripts.sync(NODE, QUEUE, delay_ms=60_000) == 0
    assert deduct_keys(NODE, QUEUE)[4] == offset_key(NODE)


@pytest.mark.parametrize(("redis_term", "redis_offset", "known"), [
    (None, None, Generation(1, 0)),  # restarted empty after a rebuild
    (None, None, Generation(0, 4)),  # restarted empty after orders
    (3, 9, Generation(4, 9)),  # an older snapshot from before the last rebuild
    (3, 9, Generation(3, 12)),  # an older snapshot missing three deductions
])
def test_deduct_refuses_a_node_older_than_the_database(
    scripts: StockScripts, client: redis.Redis, redis_term: int | None,
    redis_offset: int | None, known: Generation,
) -> None:
    if redis_term is not None:
        client.set(term_key(NODE), redis_term)
        client.set(offset_key(NODE), redis_offset or 0)
    with pytest.raises(NodeStale) as info:
        scripts.deduct(NODE, QUEUE, "oi-1", "sku-a", 1, "m-1", known)
    assert info.value.code == STALE and ACTIONS[STALE] == Action.ABORT_BATCH
    assert stock(client) == 10 and client.hlen(deducted_key(NODE)) == 0
    level = Generation(int(client.get(term_key(NODE)) or 0), known.offset)
    client.set(offset_key(NODE), known.offset)
    assert scripts.deduct(NODE, QUEUE, "oi-1", "sku-a", 1, "m-1", level).entry.offset == (
        known.offset + 1)


def test_rebuild_levels_the_offset_counter_and_restarts_restocked_offsets(
    scripts: StockScripts, client: redis.Redis
) -> None:
    (entry,) = queued(scripts, "oi-1")
    scripts.restock(NODE, QUEUE, TOKEN, [(entry, False)])
    assert client.hlen(offsets_key(NODE, QUEUE)) == 1
    client.set(maintaining_key(NODE), "maint")
    scripts.rebuild(NODE, [QUEUE], "maint", Generation(2, 40), [], [])
    assert int(client.get(offset_key(NODE)) or 0) == 40
    assert client.exists(offsets_key(NODE, QUEUE)) == 0
    scripts.rebuild(NODE, [QUEUE], "maint", Generation(2, 5), [], [])  # never backwards
    assert int(client.get(offset_key(NODE)) or 0) == 40


def test_consumed_entries_take_their_records_and_attempts_along(
    scripts: StockScripts, client: redis.Redis
) -> None:
    paid, unpaid = queued(scripts, "oi-p", "oi-u")
    for entry in (paid, unpaid):
        client.hset(attempts_key(NODE, QUEUE), format_entry(entry), 1)
    results = scripts.restock(NODE, QUEUE, TOKEN, [(paid, True), (unpaid, False)])
    assert [r.status for r in results] == [PAID, SUCCESS]
    assert client.hlen(deducted_key(NODE)) == 0 and client.hlen(attempts_key(NODE, QUEUE)) == 0
    # A later copy of the paid entry (its record gone) is consumed, not restocked.
    client.zadd(delay_key(NODE, QUEUE), {format_entry(paid): 1})
    (again,) = scripts.restock(NODE, QUEUE, TOKEN, [(paid, True)])
    assert again.status == HAS_BEEN_CONSUMED and stock(client) == 8


def test_discard_removes_raw_bytes_and_the_record(
    scripts: StockScripts, client: redis.Redis
) -> None:
    (entry,) = queued(scripts, "oi-x")
    client.zadd(delay_key(NODE, QUEUE), {b"\xff\xfe": 0})
    assert scripts.discard(NODE, QUEUE, TOKEN, [b"\xff\xfe", format_entry(entry)]) == 2
    assert client.zcard(delay_key(NODE, QUEUE)) == 0 and client.hlen(deducted_key(NODE)) == 0
