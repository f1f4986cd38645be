"""Stock shards on a Sentinel group (one master, one replica, three sentinels): the master is
SIGKILLed mid-restock; after the failover, each shard's rebuild (term bump) returns its stock
to total - held - paid, and the flow then completes exactly once. Prints the recovery time."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker

from tasks.deadletters.store import DeadLetters
from tasks.restock.maintenance import RebuildOutcome
from tasks.restock.shop import StockUnavailable
from tasks.restock.tables import ItemState
from tests.restock.conftest import DELAY_MS, FakeClockMs, World
from tests.support.redis_sentinel import SentinelGroup, sentinel_group
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(180)

SHARDS = 4
TOTAL = 40
SKUS = [f"sku-{i}" for i in range(8)]


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with sentinel_group() as started:
        yield started


def order_some(world: World, start: int, count: int, rng: random.Random) -> None:
    for n in range(start, start + count):
        lines = [[f"i-{n}-{k}", rng.choice(SKUS), rng.randint(1, 3)] for k in range(2)]
        world.shop.place_order(f"o-{n}", f"m-{n % 4}", lines)
        if n % 3 == 0:
            world.shop.pay(f"o-{n}")


def rebuild_until_recovered(world: World, deadline: float) -> None:
    """What beat's tick does after a failover: rebuild every shard that is due (behind the
    database, or never rebuilt on this master) until every shard answers; then force one
    rebuild of each (the term bump) so every shard's stock is recounted."""
    pending = set(range(SHARDS))
    while pending:
        for shard in sorted(pending):
            try:
                world.rebuilders[shard].rebuild(force=True)
                pending.discard(shard)
            except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
                pass
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"shards {sorted(pending)} not rebuilt")
        time.sleep(0.1)


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_master_killed_mid_restock_recovers_by_rebuild_with_a_term_bump(
    restock_engine: Engine, group: SentinelGroup
) -> None:
    world = World(sessionmaker(restock_engine, expire_on_commit=False), [], FakeClockMs(),
                  shards=SHARDS, make_clients=lambda: [group.master_client()])
    try:
        for sku in SKUS:
            world.shop.define_sku(sku, TOTAL)
        world.rebuild_all()  # term 1 everywhere
        rng = random.Random(3)
        order_some(world, 0, 30, rng)
        world.clock.advance(DELAY_MS + 100)
        order_some(world, 30, 20, rng)  # these stay held: not due yet
        for drainer in world.drainers:
            for queue in world.router.queues:
                drainer.sync(queue)
        drains = threading.Thread(target=settle_quietly, args=(world,))
        drains.start()
        started = time.monotonic()
        failover_s = group.kill_master()
        drains.join(60)
        rebuild_until_recovered(world, time.monotonic() + 60)
        recovered_s = time.monotonic() - started
        print(f"\nsentinel failover: new master after {failover_s:.2f}s, every shard rebuilt "
              f"(term bumped) {recovered_s:.2f}s after the kill")
        for shard in range(SHARDS):
            assert int(world.nodes[shard].client.get(f"term:{{stock:{shard}}}")) >= 2
        for sku in SKUS:  # total - held - paid, whatever the failover lost
            held = world.qty(sku, ItemState.HELD) + world.reserved_on_record(sku)
            assert world.stock(sku) == TOTAL - held - world.qty(sku, ItemState.PAID), sku
        world.check_conserved()
        order_some(world, 50, 5, rng)  # the new master takes orders
        world.clock.advance(DELAY_MS + 100)
        # What beat's tick does: drain again until nothing is due. A drain the kill cut short
        # could not release its lease on the new master, so passes wait out its TTL (2 s).
        wait_until(lambda: settled(world), 30, "every unpaid item back on the new master")
        world.settle()  # one more pass restocks nothing twice
        for sku in SKUS:  # every unpaid item back exactly once
            assert world.stock(sku) == TOTAL - world.qty(sku, ItemState.PAID), sku
        assert world.qty(SKUS[0], ItemState.HELD, ItemState.RESERVING) == 0
        assert DeadLetters(world.sessions).list() == []
        assert all(r.rebuild(force=True).outcome == RebuildOutcome.REBUILT
                   for r in world.rebuilders)
    finally:
        world.close()


def settled(world: World) -> bool:
    """One pass of every drain; true once no unpaid item is held or reserving any more."""
    world.settle()
    return all(world.qty(sku, ItemState.HELD, ItemState.RESERVING) == 0 for sku in SKUS)


def settle_quietly(world: World) -> None:
    """Drain while the master dies: whatever fails is picked up by the next pass."""
    for _ in range(3):
        try:
            world.settle()
        except (redis.RedisError, OSError, StockUnavailable):
            time.sleep(0.2)
