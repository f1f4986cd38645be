"""The restock guarantees of issue 9, each on the scenario that broke it: worker clocks, a stale
stock node, a rebuild longer than its lease TTL, a foreign delay-queue member, crash loops
(drain and rebuild), and keys that must return to their baseline."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from tasks.deadletters.store import DeadLetters
from tasks.restock.drain import DEAD_LETTER_KIND, Drainer
from tasks.restock.keys import (
    attempts_key,
    deducted_key,
    delay_key,
    drain_lock_key,
    maintaining_key,
    offsets_key,
    redo_key,
)
from tasks.restock.maintenance import REBUILD_DEAD_LETTER_KIND, Rebuilder, RebuildOutcome
from tasks.restock.shards import StockShard
from tasks.restock.shop import Shop, StockUnavailable
from tasks.restock.tables import ItemState
from tests.restock.conftest import DELAY_MS, World
from tests.support.workers import ROOT, platform_env

SQLITE = pytest.mark.parametrize("db_kind", ["sqlite"])
EVERY_DATABASE = pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])

DAY_NS = 24 * 3600 * 10**9


@contextmanager
def worker_clock_off_by(monkeypatch: pytest.MonkeyPatch, ns: int) -> Iterator[None]:
    """This process's wall clock runs `ns` ahead (negative: behind), as a skewed worker's."""
    real_ns, real_s = time.time_ns, time.time
    with monkeypatch.context() as patch:
        patch.setattr(time, "time_ns", lambda: real_ns() + ns)
        patch.setattr(time, "time", lambda: real_s() + ns / 1e9)
        yield


def redis_now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def sold(world: World, sku: str) -> int:
    return world.qty(sku, ItemState.HELD, ItemState.PAID)


# --- item 8: one clock ---------------------------------------------------------------------


@SQLITE
def test_skewed_worker_clocks_neither_move_due_times_nor_release_early(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Due times and 'now' are the stock node's Redis TIME, whatever the workers' clocks say."""
    delay = 1500
    node = StockShard.on(0, redis.Redis(port=world.servers[0].port))  # the node's real clock
    other = StockShard.on(1, redis.Redis(port=world.servers[1].port))
    shop = Shop(world.sessions, [node.scripts, other.scripts], world.router)
    client = node.client
    try:
        shop.define_sku("sku-a", 10)
        before = redis_now_ms(client)
        with worker_clock_off_by(monkeypatch, DAY_NS):  # a shop a day fast
            (fast,) = shop.place_order("o-1", "m-1", [["i-1", "sku-a", 1]])
        with worker_clock_off_by(monkeypatch, -DAY_NS):  # and one a day slow
            (slow,) = shop.place_order("o-2", "m-1", [["i-2", "sku-a", 1]])
        after = redis_now_ms(client)
        for item in (fast, slow):
            entry_time = int((item.entry or "").split(":")[6])
            assert before <= entry_time <= after, (item.entry, before, after)
        with worker_clock_off_by(monkeypatch, DAY_NS):  # a drainer a day fast
            drainer = Drainer(world.sessions, node, delay_ms=delay, lease_ttl=2.0)
            drainer.sync("q0")
            scores = [int(s) for _, s in client.zrange(delay_key(0, "q0"), 0, -1,
                                                       withscores=True)]
            assert all(before + delay <= s <= after + delay + 1 for s in scores), scores
            report = drainer.drain("q0")
        assert report.restocked == 0 and world.stock("sku-a") == 8  # nothing released early
        shop.pay("o-1")  # inside its window: payable
        time.sleep((after + delay + 50 - redis_now_ms(client)) / 1000)
        with worker_clock_off_by(monkeypatch, -DAY_NS):  # a drainer a day slow
            report = Drainer(world.sessions, node, delay_ms=delay, lease_ttl=2.0).drain("q0")
        assert report.restocked == 1 and world.stock("sku-a") == 9  # o-2 is back on time
    finally:
        for n in (node, other):
            n.close()
            n.client.close()


# --- item 9: a stale node refuses deductions until rebuilt ----------------------------------


def snapshot(client: redis.Redis) -> list[tuple[bytes, bytes]]:
    return [(key, client.dump(key)) for key in client.keys("*")]


def restore(client: redis.Redis, saved: list[tuple[bytes, bytes]]) -> None:
    """The node restarted from an older snapshot: exactly the saved keys, nothing newer."""
    client.flushdb()
    for key, value in saved:
        client.restore(key, 0, value)


def try_to_sell(world: World, prefix: str, count: int) -> None:
    for i in range(count):
        try:
            world.shop.place_order(f"{prefix}-{i}", "m-1", [[f"{prefix}-i-{i}", "sku-a", 1]])
        except StockUnavailable:
            pass


@EVERY_DATABASE
def test_a_node_restored_from_an_older_snapshot_sells_nothing_twice(world: World) -> None:
    world.shop.define_sku("sku-a", 10)
    world.rebuild_all()
    client = world.nodes[0].client
    saved = snapshot(client)
    try_to_sell(world, "before", 6)
    assert sold(world, "sku-a") == 6
    restore(client, saved)  # stock 10 again in Redis, 6 sold in the database
    try_to_sell(world, "after", 10)
    assert sold(world, "sku-a") == 6  # refused: the node is older than the database
    assert world.rebuilders[0].rebuild().outcome == RebuildOutcome.REBUILT  # due: stale
    try_to_sell(world, "rebuilt", 10)
    assert sold(world, "sku-a") == 10 and world.stock("sku-a") == 0
    world.check_conserved()


@SQLITE
def test_an_empty_restart_then_define_sku_sells_nothing_twice(world: World) -> None:
    world.shop.define_sku("sku-a", 10)
    try_to_sell(world, "before", 10)
    assert sold(world, "sku-a") == 10
    world.nodes[0].client.flushdb()  # restarted empty
    world.shop.define_sku("sku-a", 10)  # must not set the stock to the full total
    assert (world.stock("sku-a") or 0) == 0
    try_to_sell(world, "after", 10)
    assert sold(world, "sku-a") == 10
    world.rebuild_all()
    try_to_sell(world, "rebuilt", 3)
    assert sold(world, "sku-a") == 10 and world.stock("sku-a") == 0
    world.check_conserved()


# --- item 10: a rebuild reading for longer than its lease TTL -------------------------------


@EVERY_DATABASE
def test_a_rebuild_that_reads_longer_than_its_lease_ttl_completes(world: World) -> None:
    skus = [f"sku-{i}" for i in range(12)]
    for sku in skus:
        world.shop.define_sku(sku, 100)
    for n in range(60):
        world.shop.place_order(f"o-{n}", "m-1", [[f"i-{n}", skus[n % len(skus)], 1]])
        if n % 3:
            world.shop.pay(f"o-{n}")
    reads: list[float] = []

    def slow_reader() -> None:  # a slow database: each chunk of the read takes 0.25 s
        reads.append(time.monotonic())
        time.sleep(0.25)

    for node in world.nodes:
        rebuilder = Rebuilder(world.sessions, node, world.router.queues,
                              lease_ttl=1.0, chunk=2, on_read=slow_reader)
        report = rebuilder.rebuild(force=True)
        assert report.outcome == RebuildOutcome.REBUILT, report
    assert reads[-1] - reads[0] > 1.0  # the reading outlasted one TTL
    world.check_conserved()


# --- item 11: a foreign delay-queue member ---------------------------------------------------


@SQLITE
def test_a_foreign_member_is_dead_lettered_once_and_removed(world: World) -> None:
    world.shop.define_sku("sku-a", 10)
    client = world.nodes[0].client
    client.zadd(delay_key(0, "q0"), {b"\xff\xfe": 0})
    for _ in range(4):
        world.drainers[0].drain("q0")
    letters = DeadLetters(world.sessions).list(DEAD_LETTER_KIND)
    assert len(letters) == 1 and "UTF-8" in letters[0].reason
    assert client.zcard(delay_key(0, "q0")) == 0
    assert client.hlen(attempts_key(0, "q0")) == 0


# --- item 12: every key has an end ---------------------------------------------------------


def footprint(world: World) -> dict[str, int]:
    """Keys per node, and the size of each per-item structure."""
    sizes: dict[str, int] = {}
    for node in world.nodes:
        n, c = node.number, node.client
        sizes[f"keys:{n}"] = int(c.dbsize())
        sizes[f"deducted:{n}"] = int(c.hlen(deducted_key(n)))
        for q in world.router.queues:
            sizes[f"delay:{n}:{q}"] = int(c.zcard(delay_key(n, q)))
            sizes[f"attempts:{n}:{q}"] = int(c.hlen(attempts_key(n, q)))
            sizes[f"redo:{n}:{q}"] = int(c.xlen(redo_key(n, q)))
            sizes[f"offsets:{n}:{q}"] = int(c.hlen(offsets_key(n, q)))
    return sizes


def run_orders(world: World, start: int, count: int) -> None:
    members = ["m-1", "m-4"]
    for n in range(start, start + count):
        sku = ("sku-a", "sku-d")[n % 2]
        world.shop.place_order(f"o-{n}", members[n // 2 % 2], [[f"i-{n}", sku, 1]])
        if n % 3 == 0:
            world.shop.pay(f"o-{n}")
    world.clock.advance(DELAY_MS + 1000)
    world.settle()
    world.settle()


@SQLITE
def test_keys_return_to_their_baseline_whatever_the_number_of_orders(world: World) -> None:
    for sku in ("sku-a", "sku-d"):
        world.shop.define_sku(sku, 10**6)
    world.rebuild_all()
    run_orders(world, 0, 8)  # every kind of key exists once
    baseline = footprint(world)
    run_orders(world, 8, 40)
    after_small = footprint(world)
    run_orders(world, 48, 400)
    after_large = footprint(world)
    assert after_small == baseline and after_large == baseline, (baseline, after_large)
    world.check_conserved()


# --- item 4: crash loops are capped ----------------------------------------------------------


def run_proc(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tests.restock.drainer_proc", world.servers[0].url,
            world.sessions.kw["bind"].url.render_as_string(False), "0", *args]
    return subprocess.run(argv, cwd=ROOT, env=platform_env(), capture_output=True, text=True,
                          timeout=60)


def wait_for_lapse(world: World, key: str) -> None:
    deadline = time.monotonic() + 10
    while world.nodes[0].client.exists(key) and time.monotonic() < deadline:
        time.sleep(0.05)


@SQLITE
def test_an_entry_that_kills_its_drainer_is_dead_lettered_after_the_cap(world: World) -> None:
    cap = 3
    world.shop.define_sku("sku-a", 20)
    for i in range(5):
        world.shop.place_order(f"o-{i}", "m-1", [[f"i-{i}", "sku-a", 2]])
    world.clock.advance(DELAY_MS + 100)
    world.drainers[0].sync("q0")
    lease = drain_lock_key(0, "q0")
    crashes = 0
    for _ in range(cap + 3):
        wait_for_lapse(world, lease)
        done = run_proc(world, "drain", "q0", str(world.clock()), "1.0", str(cap), "i-2")
        if done.returncode == 0:
            break
        assert done.returncode == 3, done.stderr
        crashes += 1
    assert crashes == cap  # the poison ran `cap` times, never again
    (letter,) = DeadLetters(world.sessions).list(DEAD_LETTER_KIND)
    assert letter.payload["entry"].startswith("i-2:") and "REDELIVERY_CAP" in letter.reason
    assert world.nodes[0].client.zcard(delay_key(0, "q0")) == 0
    assert world.stock("sku-a") == 18  # all back but the dead-lettered item's 2 units
    assert world.nodes[0].client.hlen(attempts_key(0, "q0")) == 0


@SQLITE
def test_a_rebuild_that_kills_its_worker_is_dead_lettered_once(world: World) -> None:
    cap = 2
    world.shop.define_sku("sku-a", 20)
    lease = maintaining_key(0)
    codes = []
    for _ in range(cap + 2):
        wait_for_lapse(world, lease)
        done = run_proc(world, "rebuild", "q0", "0", "1.0", str(cap), "die")
        codes.append((done.returncode, done.stdout.strip()))
    assert codes[:cap] == [(3, "")] * cap
    assert codes[cap:] == [(0, RebuildOutcome.DEAD_LETTERED)] * 2
    (letter,) = DeadLetters(world.sessions).list(REBUILD_DEAD_LETTER_KIND)
    assert "REDELIVERY_CAP" in letter.reason and letter.payload["node"] == 0
    report = world.rebuilders[0].rebuild(force=True)  # an operator's forced rebuild runs
    assert report.outcome == RebuildOutcome.REBUILT
    assert world.stock("sku-a") == 20

