"""Leases on a real 3-master Redis Cluster: every script stays in one slot, the keeper sends one
renew_many per slot in one pipeline (one round trip per master), and a lease survives its
slot migrating to another master."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from lease import Keeper, Leases, NotAcquired
from lease.keys import fence_key, lease_key
from lease.renewal import group_by_slot
from tests.lease.conftest import FakeClock, RoundTrips, heartbeating
from tests.support.redis_cluster import Cluster, redis_cluster

TTL = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with redis_cluster(masters=3) as started:
        yield started


@pytest.fixture
def client(cluster: Cluster) -> Iterator[RedisCluster]:
    client = cluster.client(socket_timeout=5)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def owners(cluster: Cluster, names: list[str]) -> set[int]:
    return {cluster.owner_of(key_slot(lease_key(name).encode())) for name in names}


def test_acquire_renew_release_and_fences_across_slots(
        cluster: Cluster, client: RedisCluster, make_leases: Callable[..., Leases]) -> None:
    leases = make_leases(client)
    names = [f"cl:{i}" for i in range(30)]
    assert owners(cluster, names) == {0, 1, 2}
    held = [leases.acquire(name, ttl=TTL) for name in names]
    assert [lease.fence for lease in held] == [1] * 30
    with pytest.raises(NotAcquired):
        leases.acquire(names[0], ttl=TTL)
    for lease in held:
        lease.renew()
        assert 55_000 < client.pttl(lease_key(lease.name)) <= 60_000
        lease.release()
    assert not any(client.exists(lease_key(name)) for name in names)
    again = [leases.acquire(name, ttl=TTL) for name in names]
    assert [lease.fence for lease in again] == [2] * 30
    assert leases.current_fence(names[5]) == 2


def test_the_fence_floor_holds_when_the_cluster_lost_the_counter(
        client: RedisCluster, make_leases: Callable[..., Leases]) -> None:
    leases = make_leases(client)
    first = leases.acquire("floor:a", ttl=TTL)
    first.release()
    client.delete(fence_key("floor:a"))  # a failover to a replica that had not seen it
    assert leases.acquire("floor:a", ttl=TTL, fence_floor=first.fence).fence == first.fence + 1


def count_round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every request written to any Redis socket (a pipeline writes one per node)."""
    sent: list[int] = []
    original = redis.connection.Connection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(self.port)
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counted)
    return sent


def evalsha_calls(cluster: Cluster) -> int:
    total = 0
    for i in range(cluster.masters):
        stats = cluster.node_client(i).info("commandstats")
        total += int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return total


TTL = 60.0


def test_the_keeper_renews_300_leases_on_every_master_in_one_round_trip_per_node(
        cluster: Cluster, client: RedisCluster, make_leases: Callable[..., Leases],
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    keeper = Keeper(client, clock=clock, threads=False)
    leases = make_leases(client, clock=clock, keeper=keeper)
    # A TTL far longer than the test takes on a busy machine (Redis expires keys by its own
    # clock); the fake clock makes each tick due (a third of the TTL).
    held = [leases.acquire(f"many:{i}", ttl=TTL) for i in range(300)]
    assert owners(cluster, [lease.name for lease in held]) == {0, 1, 2}
    slots = len(group_by_slot([lease_key(lease.name).encode() for lease in held]))
    for tick in range(3):
        for lease in held:
            lease.heartbeat()
        clock.advance(TTL / 3)
        calls_before = evalsha_calls(cluster)
        sent = count_round_trips(monkeypatch)
        assert keeper.tick() == 300
        monkeypatch.undo()
        print(f"tick {tick}: 300 leases in {slots} slots, {len(sent)} round trips "
              f"to {len(set(sent))} masters")
        assert len(set(sent)) == 3
        calls = evalsha_calls(cluster) - calls_before
        if tick == 0:  # no master has the script yet: a pipeline, SCRIPT LOAD, the pipeline again
            assert len(sent) == 9
            assert calls == 2 * slots
        else:
            assert len(sent) == 3, "one pipelined request per master"
            assert calls == slots, "one script call per slot"
    assert all(TTL * 1000 - 10_000 < client.pttl(lease_key(lease.name)) <= TTL * 1000
               for lease in held)
    assert not any(lease.lost for lease in held)


def test_a_tick_renews_a_slot_whose_keys_are_split_by_a_migration(
        cluster: Cluster, client: RedisCluster, make_leases: Callable[..., Leases],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mid-resharding: one lease key of a slot already moved, the other not (TRYAGAIN for the
    slot's group): each lease is renewed on its own, where its key is."""
    clock = FakeClock()
    keeper = Keeper(client, clock=clock, threads=False)
    leases = make_leases(client, clock=clock, keeper=keeper)
    a, b = leases.acquire("{split}a", ttl=3.0), leases.acquire("{split}b", ttl=3.0)
    slot = key_slot(b"{split}")
    src = cluster.owner_of(slot)
    dst = (src + 1) % cluster.masters
    source, target = cluster.node_client(src), cluster.node_client(dst)
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(src))
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(dst))
    source.execute_command("MIGRATE", "127.0.0.1", cluster.nodes[dst].port, "", 0, 5000,
                           "KEYS", lease_key(a.name))
    try:
        a.heartbeat()
        b.heartbeat()
        clock.advance(1.0)
        singles = RoundTrips(leases, monkeypatch)
        assert keeper.tick() == 2
        assert singles.calls == [1, 1], "the split slot's leases, one call each"
        assert not a.lost and not b.lost
    finally:
        moved = cluster.move_slot(slot, dst)
    assert moved >= 1  # b's lease key and the fences followed
    assert 2_500 < client.pttl(lease_key(a.name)) <= 3_000
    a.release()
    b.release()
    assert not client.exists(lease_key(a.name), lease_key(b.name))


def test_a_tick_follows_a_slot_that_moved_since_the_client_last_looked(
        cluster: Cluster, client: RedisCluster, make_leases: Callable[..., Leases]) -> None:
    clock = FakeClock()
    keeper = Keeper(client, clock=clock, threads=False)
    leases = make_leases(client, clock=clock, keeper=keeper)
    held = [leases.acquire(f"stale:{i}", ttl=3.0) for i in range(10)]
    slot = key_slot(lease_key(held[0].name).encode())
    to = (cluster.owner_of(slot) + 1) % cluster.masters
    assert cluster.move_slot(slot, to) == 2  # behind the client's back: its table is stale
    for lease in held:
        lease.heartbeat()
    clock.advance(1.0)
    assert keeper.tick() == 10  # the moved slot's call answered MOVED, sent again
    assert client.nodes_manager.get_node_from_slot(slot).port == cluster.nodes[to].port
    assert 2_500 < client.pttl(lease_key(held[0].name)) <= 3_000


def test_a_held_lease_survives_its_slot_moving_to_another_master(
        cluster: Cluster, client: RedisCluster, make_leases: Callable[..., Leases]) -> None:
    leases = make_leases(client)
    lease = leases.acquire("moving", ttl=1.0)
    slot = key_slot(lease_key("moving").encode())
    before = cluster.owner_of(slot)
    with heartbeating(lease):
        time.sleep(0.5)
        assert cluster.move_slot(slot, (before + 1) % cluster.masters) >= 2  # lease + fence
        time.sleep(2.5)  # more than two TTLs on the new master
        lease.check()
    assert cluster.owner_of(slot) != before
    assert leases.stats()["renewed"] >= 3
    with pytest.raises(NotAcquired):
        leases.acquire("moving", ttl=1.0)
    lease.release()
    assert leases.acquire("moving", ttl=1.0).fence == lease.fence + 1


def test_blocking_acquire_is_woken_by_the_release(
        client: RedisCluster, make_leases: Callable[..., Leases]) -> None:
    leases = make_leases(client)
    held = leases.acquire("waited", ttl=TTL)
    releaser = threading.Timer(0.3, held.release)
    releaser.start()
    started = time.monotonic()
    got = leases.acquire("waited", ttl=TTL, blocking=True, timeout=10)
    waited = time.monotonic() - started
    releaser.join()
    assert got.fence == held.fence + 1
    assert 0.2 < waited < 5, waited  # woken by the release, not by the 60 s TTL


def test_scripts_are_loaded_again_on_masters_that_lost_them(
        cluster: Cluster, client: RedisCluster, make_leases: Callable[..., Leases]) -> None:
    clock = FakeClock()
    keeper = Keeper(client, clock=clock, threads=False)
    leases = make_leases(client, clock=clock, keeper=keeper)
    held = [leases.acquire(f"flushed:{i}", ttl=3.0) for i in range(20)]
    for i in range(cluster.masters):
        cluster.node_client(i).script_flush()
    for lease in held:
        lease.heartbeat()
    clock.advance(1.0)
    assert keeper.tick() == 20
    for i in range(cluster.masters):
        cluster.node_client(i).script_flush()
    assert leases.acquire("flushed:new", ttl=3.0).fence == 1
    held[0].release()


def test_bench_lease_runs_on_a_cluster_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.lease import main

    assert main(["--cluster", "--n", "100", "--batch", "60", "--rounds", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["cluster_masters"] == 3
    # The batch side checks that every tick renewed all 60 leases (it raises otherwise).
    assert set(result) == {"acquire_ratio", "renew_ratio", "release_ratio",
                           "batch_renew_speedup", "cluster_masters"}
    assert all(value > 0 for value in result.values())
