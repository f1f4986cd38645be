"""Random restock workloads on two real Redis nodes, and on a 3-master Redis Cluster
(hypothesis): the invariants hold.

Each example places random orders, pays some, lets time pass, drains, re-delivers the redo
log, bumps terms with rebuilds, opens a maintenance window, crashes a drainer between its
payment lookup and its restock, crashes a rebuild between its script calls (or after them,
before it records the re-issued entries), and restarts a Redis node (which comes back empty);
on the cluster, that last step moves the shard's slot to another master instead (resharding).
After
every settle, and at the end once every delay has passed, for every SKU:

    free stock in Redis + stock held by unpaid items + stock of paid items == total
    free stock >= 0;  at the end: free == total - paid, no item held, every log drained
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot
from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import sessionmaker

from lease import Leases
from tasks.deadletters.store import DeadLetters
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.restock.keys import (
    delay_key,
    maintenance_lease_name,
    meta_key,
    redo_cursor_key,
    redo_key,
    shard_tag,
)
from tasks.restock.shop import OrderError, OrderExpired, OrderPending, StockUnavailable
from tasks.restock.tables import ORDER_ITEMS, ORDERS, PAYMENTS, RESTOCK_NODES, SKUS, ItemState
from tests.restock.conftest import DELAY_MS, FakeClockMs, World
from tests.support.db import fresh_database
from tests.support.redis_cluster import Cluster, redis_cluster
from tests.support.redis_server import RedisServer

SKUS_TOTAL = {"sku-a": 12, "sku-b": 7, "sku-d": 9, "sku-e": 5}  # a, b on node 0; d, e on 1
MEMBERS = ["m-1", "m-2", "m-4"]


class Crash(Exception):
    """A drainer or a rebuild dying mid-way."""


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    started = [RedisServer().start(), RedisServer().start()]
    yield started
    for server in started:
        server.kill()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = Path(tmp_path_factory.mktemp("props")) / "props.sqlite"
    eng = fresh_database(f"sqlite:///{path}")
    yield eng
    eng.dispose()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("order"), st.sampled_from(MEMBERS),
                  st.lists(st.tuples(st.sampled_from(sorted(SKUS_TOTAL)),
                                     st.integers(1, 5)), min_size=1, max_size=3)),
        st.tuples(st.just("pay"), st.integers(0, 40)),
        st.tuples(st.just("advance"), st.integers(0, 2 * DELAY_MS)),
        st.tuples(st.just("settle")),
        st.tuples(st.just("redeliver"), st.integers(0, 1)),
        st.tuples(st.just("rebuild"), st.integers(0, 1)),
        st.tuples(st.just("maintain"), st.integers(0, 1)),
        st.tuples(st.just("crash"), st.integers(0, 1)),
        st.tuples(st.just("crash_rebuild"), st.integers(0, 1), st.integers(1, 3)),
        st.tuples(st.just("restart"), st.integers(0, 1)),
    ),
    min_size=10,
    max_size=40,
)


class Workload:
    def __init__(self, world: World, cluster: Cluster | None = None) -> None:
        self.w = world
        self.cluster = cluster
        self.orders: list[str] = []
        self.items = 0

    def run(self, op: tuple[Any, ...]) -> None:
        getattr(self, f"op_{op[0]}")(*op[1:])

    def op_order(self, member: str, lines: list[tuple[str, int]]) -> None:
        order_id = f"o-{len(self.orders)}"
        self.orders.append(order_id)
        items = []
        for sku, qty in lines:
            items.append([f"i-{self.items}", sku, qty])
            self.items += 1
        try:
            self.w.shop.place_order(order_id, member, items)
        except StockUnavailable:
            pass  # a node in maintenance or restarting: the items stay 'reserving'

    def op_pay(self, k: int) -> None:
        if self.orders:
            try:
                self.w.shop.pay(self.orders[k % len(self.orders)])
            except (OrderExpired, OrderPending):
                pass
            except OrderError as exc:  # pragma: no cover - would be a bug
                raise AssertionError(exc) from exc

    def op_advance(self, ms: int) -> None:
        self.w.clock.advance(ms)

    def op_settle(self) -> None:
        self.w.settle()
        self.w.check_conserved()

    def op_redeliver(self, node: int) -> None:
        """Entries delivered again: the sync restarts from the start of what the log still
        holds, and every entry already consumed (or released) is queued again, due now."""
        client = self.w.nodes[node].client
        for queue in self.w.router.queues:
            client.delete(redo_cursor_key(node, queue))
            self.w.drainers[node].sync(queue)
        with self.w.sessions() as session:
            done = list(session.execute(
                select(ORDER_ITEMS.c.queue, ORDER_ITEMS.c.entry)
                .where(ORDER_ITEMS.c.redis_id == node, ORDER_ITEMS.c.entry.is_not(None),
                       ORDER_ITEMS.c.state.in_((ItemState.PAID, *ItemState.RETURNED)))))
        for queue, entry in done:
            client.zadd(delay_key(node, queue), {entry: self.w.clock()}, nx=True)

    def op_rebuild(self, node: int) -> None:
        self.w.rebuilders[node].rebuild(force=True)

    def op_maintain(self, node: int) -> None:
        """Hold the window open while orders, syncs and drains try to run."""
        leases = Leases(self.w.nodes[node].client)
        try:
            window = leases.acquire(maintenance_lease_name(node), ttl=5.0)
            self.op_order(MEMBERS[0], [("sku-a" if node == 0 else "sku-d", 1)])
            self.w.settle()
            window.release()
        finally:
            leases.close()

    def op_crash(self, node: int) -> None:
        drainer = self.w.drainers[node]

        def die(_entries: object) -> None:
            raise Crash

        drainer.before_restock = die
        try:
            for queue in self.w.router.queues:
                drainer.sync(queue)
                try:
                    drainer.drain(queue)
                except Crash:
                    pass
        finally:
            drainer.before_restock = None

    def op_crash_rebuild(self, node: int, calls: int) -> None:
        """A due rebuild dies right after its `calls`-th rebuild.lua call: the term is set
        and the stock written, maybe some items re-issued in Redis, but none recorded in the
        database (their records keep the older entry's text). Its lease ends with it; the
        shard stays due, so a later rebuild (beat's, or `finish`) does the work again."""
        shard = self.w.nodes[node]
        made = 0

        def dying(*args: Any) -> Any:
            nonlocal made
            reply = type(shard.scripts).rebuild(shard.scripts, *args)
            made += 1
            if made == calls:
                raise Crash
            return reply

        shard.scripts.rebuild = dying  # type: ignore[method-assign]
        shard.client.hset(meta_key(node), "next_maintain_ms", self.w.clock())  # window open
        try:
            self.w.rebuilders[node].rebuild()
        except Crash:
            pass
        finally:
            del shard.scripts.rebuild  # the class's method again

    def op_restart(self, node: int) -> None:
        if self.cluster is not None:  # reshard: the shard's slot moves to the next master
            slot = key_slot(shard_tag(node).encode())
            self.cluster.move_slot(slot, (self.cluster.owner_of(slot) + 1) % 3)
            return
        self.w.servers[node].restart()
        self.w.rebuilders[node].rebuild()  # due at once: the node lost its schedule

    def finish(self) -> None:
        """Every delay passes; beat rebuilds what needs it and drains everything."""
        self.w.clock.advance(2 * DELAY_MS + 10_000)
        for rebuilder in self.w.rebuilders:
            rebuilder.rebuild()  # a node that restarted without a rebuild is due
        for _ in range(3):
            self.w.settle()


def reset(world: World, engine: Engine) -> None:
    for node in world.nodes:
        node.client.flushall()
    with engine.begin() as conn:
        for table in (ORDER_ITEMS, ORDERS, PAYMENTS, SKUS, RESTOCK_NODES, DEAD_LETTERS):
            conn.execute(delete(table))
    for sku, total in SKUS_TOTAL.items():
        world.shop.define_sku(sku, total)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with redis_cluster(masters=3) as started:
        yield started


def check_workload(world: World, engine: Engine, script: list[tuple[Any, ...]],
                   cluster: Cluster | None = None) -> None:
    try:
        reset(world, engine)
        work = Workload(world, cluster)
        for op in script:
            work.run(op)
        work.finish()
        world.check_conserved()
        with world.sessions() as session:
            rows = list(session.execute(select(ORDER_ITEMS.c.order_item_id,
                                               ORDER_ITEMS.c.state)))
        held = [oid for oid, state in rows if state == ItemState.HELD]
        assert held == [], f"items still holding stock after every delay: {held}"
        for sku, total in SKUS_TOTAL.items():
            assert world.stock(sku) == total - world.qty(sku, ItemState.PAID)
        for node in world.nodes:
            for queue in world.router.queues:
                n = node.number
                assert node.client.zcard(delay_key(n, queue)) == 0
                assert world.drainers[n].sync(queue).moved == 0
                assert node.client.exists(redo_key(n, queue)) in (0, 1)
        assert DeadLetters(world.sessions).list() == []
    finally:
        world.close()


# 120 workloads with Redis restarts: about a minute alone, more beside the parallel suite.
@pytest.mark.timeout(480)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=ops)
def test_random_workloads_keep_every_invariant(
    servers: list[RedisServer], engine: Engine, script: list[tuple[Any, ...]]
) -> None:
    world = World(sessionmaker(engine, expire_on_commit=False), servers, FakeClockMs())
    check_workload(world, engine, script)


# The same workloads on a 3-master cluster: two shards on one RedisCluster client, a restart
# replaced by moving the shard's slot to another master. Fewer examples (slower round trips),
# derandomized: a fixed set, so the suite does not search afresh on every run.
@pytest.mark.timeout(300)
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=ops)
def test_random_workloads_keep_every_invariant_on_a_cluster(
    cluster: Cluster, engine: Engine, script: list[tuple[Any, ...]]
) -> None:
    world = World(sessionmaker(engine, expire_on_commit=False), [], FakeClockMs(), shards=2,
                  make_clients=lambda: [cluster.client(socket_timeout=2.0)])
    check_workload(world, engine, script, cluster)


# Found by the random search: a redelivery re-synced the last queued entry (i-5, offset 8)
# and it became due with the first one, before i-3 and i-4 of the same SKU and queue. The
# drain batch (7 entries) that restocked i-5 ended before i-4 (offset 7), which then met
# HAS_BEEN_CONSUMED: i-4 stayed 'released' and one unit of sku-a never came back.
REDELIVERED_AHEAD = [
    ("order", "m-1", [("sku-a", 1)]),
    ("order", "m-1", [("sku-a", 1), ("sku-a", 1)]),
    ("pay", 0),
    ("rebuild", 0),
    ("order", "m-1", [("sku-a", 1), ("sku-a", 1), ("sku-a", 1)]),
    ("maintain", 1),
    ("redeliver", 0),
]


def item_states(world: World) -> dict[str, str]:
    """Every order item's state, by its id."""
    with world.sessions() as session:
        return {oid: state for oid, state in session.execute(
            select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.state))}


def test_a_redelivered_entry_never_makes_a_lower_offset_one_consumed(
    servers: list[RedisServer], engine: Engine
) -> None:
    world = World(sessionmaker(engine, expire_on_commit=False), servers, FakeClockMs())
    check_workload(world, engine, REDELIVERED_AHEAD)
    states = item_states(world)
    # check_workload found every unit of sku-a back but i-0's (paid); each item says so too.
    assert states == {"i-0": ItemState.PAID, **{f"i-{i}": ItemState.RESTOCKED
                                                 for i in range(1, 6)},
                      "i-6": ItemState.RESERVING}  # the order refused in maintain's window


# Found by the random search (seen failing on a saved example; reproduced here by hand): the
# rebuild re-issues held i-1 (term 1, offset 3) while its term-0 entry is still in the redo log.
# The settle's drain takes the old entry: `Drainer._claim` releases i-1 in the database by its
# id, then restock.lua removes the entry as WRONG_TERM, returning nothing. The re-issued entry,
# queued behind the redo cursor, is due 1 ms later, so at that quiet moment i-1 is 'released'
# while its unit is neither free nor held: conservation is one short until the next drain
# restocks it (the end state is right: without the last settle the workload passes). Not fixed
# here: releasing only by the item's recorded entry would restock a re-issued entry whose
# database record a crashed rebuild left behind (see docs/decisions.md, "Ranges and restock:
# one name per thing").
STALE_ENTRY_DRAINED_FIRST = [
    ("order", "m-1", [("sku-a", 1)]),
    ("order", "m-1", [("sku-a", 1)]),
    ("pay", 0),
    ("advance", DELAY_MS + 1),
    ("rebuild", 0),
    ("settle",),
]


def test_a_stale_entry_drained_before_its_reissue_keeps_the_unit_counted(
    servers: list[RedisServer], engine: Engine
) -> None:
    world = World(sessionmaker(engine, expire_on_commit=False), servers, FakeClockMs())
    check_workload(world, engine, STALE_ENTRY_DRAINED_FIRST)


# A rebuild that dies after re-issuing held i-1 in Redis (term 1), before recording the new
# entry in the database: i-1's record is still its term-0 entry. The drain takes the term-0
# entry first (WRONG_TERM: i-1 must stay held), then the term-1 one, which must release and
# restock i-1 once, although the database never recorded it (a claim by the recorded entry
# would have restocked it and left it held: one unit counted twice).
CRASHED_AFTER_REISSUE = [
    ("order", "m-1", [("sku-a", 1)]),
    ("order", "m-1", [("sku-a", 1)]),
    ("pay", 0),
    ("advance", DELAY_MS + 1),
    ("crash_rebuild", 0, 2),  # stock, then i-1 re-issued; dies before recording it
    ("settle",),
    ("advance", 1),
    ("settle",),
]

# A rebuild that dies after its term and stock, before re-issuing i-1: the term-0 entry meets
# WRONG_TERM and i-1 stays held (its unit out of the free stock, as the rebuild counted it)
# until the next rebuild re-issues it.
CRASHED_BEFORE_REISSUE = [
    ("order", "m-1", [("sku-a", 1)]),
    ("order", "m-1", [("sku-a", 1)]),
    ("pay", 0),
    ("advance", DELAY_MS + 1),
    ("crash_rebuild", 0, 1),  # term and stock only
    ("settle",),
    ("advance", 2 * DELAY_MS),
    ("settle",),
]


@pytest.mark.parametrize("script", [CRASHED_AFTER_REISSUE, CRASHED_BEFORE_REISSUE],
                         ids=["after-reissue", "before-reissue"])
def test_a_crashed_rebuild_never_counts_a_unit_twice_or_loses_it(
    servers: list[RedisServer], engine: Engine, script: list[tuple[Any, ...]]
) -> None:
    world = World(sessionmaker(engine, expire_on_commit=False), servers, FakeClockMs())
    check_workload(world, engine, script)
    states = item_states(world)
    assert states == {"i-0": ItemState.PAID, "i-1": ItemState.RESTOCKED}
