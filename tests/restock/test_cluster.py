"""The restock flow on a real 3-master Redis Cluster: 16 shards on one RedisCluster client,
the cluster putting each shard's slot on a master; resharding (slot migration) while drains
run loses and doubles nothing."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
from redis.crc import key_slot
from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker

from tasks.deadletters.store import DeadLetters
from tasks.restock.keys import attempts_key, delay_key, shard_tag
from tasks.restock.tables import ORDER_ITEMS, ItemState
from tests.restock.conftest import DELAY_MS, FakeClockMs, World
from tests.support.redis_cluster import Cluster, redis_cluster

pytestmark = pytest.mark.timeout(180)

SHARDS = 16
SKU_TOTAL = 30


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with redis_cluster(masters=3) as started:
        yield started


def cluster_world(engine: Engine, cluster: Cluster, shards: int = SHARDS) -> World:
    """A World whose shards all live on one RedisCluster client (flushed first)."""
    client = cluster.client(socket_timeout=2.0)
    client.flushall()
    client.close()
    return World(sessionmaker(engine, expire_on_commit=False), [], FakeClockMs(),
                 shards=shards, make_clients=lambda: [cluster.client(socket_timeout=2.0)])


@pytest.fixture
def cworld(restock_engine: Engine, cluster: Cluster) -> Iterator[World]:
    world = cluster_world(restock_engine, cluster)
    yield world
    world.close()


def shard_slot(shard: int) -> int:
    return key_slot(shard_tag(shard).encode())


def place_orders(world: World, orders: int, seed: int) -> list[str]:
    """Define 24 SKUs and place `orders` random orders; pay every third; return the SKUs."""
    skus = [f"sku-{i}" for i in range(24)]
    for sku in skus:
        world.shop.define_sku(sku, SKU_TOTAL)
    rng = random.Random(seed)
    for n in range(orders):
        lines = [[f"i-{n}-{k}", rng.choice(skus), rng.randint(1, 3)]
                 for k in range(rng.randint(1, 2))]
        world.shop.place_order(f"o-{n}", f"m-{n % 6}", lines)
        if n % 3 == 0:
            world.shop.pay(f"o-{n}")
    return skus


def item_states(world: World) -> dict[str, int]:
    with world.sessions() as session:
        states = [r.state for r in session.execute(select(ORDER_ITEMS.c.state))]
    return {s: states.count(s) for s in set(states)}


def check_settled(world: World, skus: list[str]) -> None:
    """Every unpaid item restocked once, every paid one sold: free == total - paid."""
    world.check_conserved()
    for sku in skus:
        assert world.stock(sku) == SKU_TOTAL - world.qty(sku, ItemState.PAID), sku
    states = item_states(world)
    assert set(states) <= {ItemState.PAID, ItemState.RESTOCKED, ItemState.REJECTED}, states
    assert DeadLetters(world.sessions).list() == []


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_restock_flow_on_a_three_master_cluster_completes_exactly_once(
    cworld: World, cluster: Cluster
) -> None:
    skus = place_orders(cworld, 60, seed=1)
    masters = {cluster.owner_of(shard_slot(cworld.router.shard_for(s))) for s in skus}
    assert masters == {0, 1, 2}  # the cluster spread the SKUs' shards over every master
    cworld.check_conserved()
    cworld.settle()  # nothing due yet
    assert item_states(cworld).get(ItemState.RESTOCKED, 0) == 0
    cworld.clock.advance(DELAY_MS + 100)
    cworld.settle()
    check_settled(cworld, skus)
    restocked = item_states(cworld)[ItemState.RESTOCKED]
    assert restocked > 0
    cworld.settle()  # a second pass finds nothing more to do
    assert item_states(cworld)[ItemState.RESTOCKED] == restocked
    cworld.rebuild_all()  # a rebuild of every shard (term bump) recounts the same stock
    check_settled(cworld, skus)


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_moving_shards_slots_while_drains_run_loses_and_doubles_nothing(
    cworld: World, cluster: Cluster
) -> None:
    skus = place_orders(cworld, 90, seed=2)
    cworld.clock.advance(DELAY_MS + 100)
    for drainer in cworld.drainers:
        for queue in cworld.router.queues:
            drainer.sync(queue)
    before = {shard: cluster.owner_of(shard_slot(shard)) for shard in range(SHARDS)}
    errors: list[BaseException] = []

    def drain_all() -> None:
        try:
            for drainer in cworld.drainers:
                for queue in cworld.router.queues:
                    drainer.drain(queue)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=drain_all) for _ in range(2)]
    for thread in threads:
        thread.start()
    moved = 0
    for shard in range(SHARDS):
        moved += cluster.move_slot(shard_slot(shard), (before[shard] + 1) % 3)
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert moved > 0
    assert all(cluster.owner_of(shard_slot(s)) == (before[s] + 1) % 3 for s in range(SHARDS))
    cworld.settle()  # whatever the migration interrupted, the next pass finishes
    check_settled(cworld, skus)


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_take_counts_each_entry_once_on_every_master(cworld: World, cluster: Cluster) -> None:
    """take.lua (due members and their write-ahead attempt counts, one call) on shards spread
    over three masters: each queued entry is taken once with count 1; a batch that never
    finished makes its first member run alone next; a drain then settles all and clears every
    count."""
    skus = place_orders(cworld, 45, seed=3)
    cworld.clock.advance(DELAY_MS + 100)
    taken: dict[tuple[int, str], list[bytes]] = {}
    for node, drainer in zip(cworld.nodes, cworld.drainers, strict=True):
        for queue in cworld.router.queues:
            drainer.sync(queue)
            queued = node.client.zrange(delay_key(node.number, queue), 0, -1)
            batch = node.scripts.take(node.number, queue, limit=1000).members
            assert batch == [(member, 1) for member in queued]
            if batch:
                taken[(node.number, queue)] = queued
    assert {cluster.owner_of(shard_slot(shard)) for shard, _ in taken} == {0, 1, 2}
    for (shard, queue), queued in taken.items():  # as if each batch's drainer had died
        assert cworld.nodes[shard].scripts.take(shard, queue).members == [(queued[0], 2)]
    cworld.settle()
    check_settled(cworld, skus)
    for node in cworld.nodes:
        for queue in cworld.router.queues:
            assert node.client.hlen(attempts_key(node.number, queue)) == 0
