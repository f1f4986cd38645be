"""Issue 18 item 5: a redo-stream time from outside (a message in microseconds, a node whose
clock ran ahead before a failover) neither stalls its delay queue nor survives a rebuild.

sync.lua clamps a message's time to the node's clock and re-scores a queued member (or a
cursor) beyond any due time the node could have given, so every later entry still comes due
on time and the far-future one no earlier than its delay after the node first saw it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tasks.restock.keys import delay_key, redo_cursor_key, redo_key, stock_key
from tasks.restock.redolog import format_entry, parse_entry
from tasks.restock.scripts import StockScripts
from tasks.restock.tables import ItemState
from tests.restock.conftest import DELAY_MS, World
from tests.restock.due import due
from tests.support.redis_server import RedisServer

NODE, QUEUE = 0, "q0"
SQLITE = pytest.mark.parametrize("db_kind", ["sqlite"])


@pytest.fixture
def client(private_redis: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(port=private_redis.port)
    yield c
    c.close()


def rewrite_times(client: redis.Redis, key: str, times: dict[int, str]) -> None:
    """Rewrite the stream with message i's `t` replaced by times[i] (what a writer in
    microseconds, or a node with a wrong clock, would have appended)."""
    messages = client.xrange(key)
    client.delete(key)
    for i, (_id, fields) in enumerate(messages):
        if i in times:
            fields = {**fields, b"t": times[i].encode()}
        client.xadd(key, fields)


def node_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_time_in_microseconds_neither_stalls_later_entries_nor_comes_due_early(
    client: redis.Redis,
) -> None:
    """On the node's own clock (Redis TIME inside the scripts, no fake clock)."""
    delay = 400
    client.hset(stock_key(NODE), "sku-a", 10)
    scripts = StockScripts(client)
    entries = [scripts.deduct(NODE, QUEUE, f"oi-{i}", "sku-a", 1, "m-1").entry
               for i in range(4)]
    rewrite_times(client, redo_key(NODE, QUEUE), {0: str(entries[0].time_ms * 1000)})
    synced_at = node_ms(client)
    assert scripts.sync(NODE, QUEUE, delay_ms=delay) == 4
    scores = [s for _, s in client.zrange(delay_key(NODE, QUEUE), 0, -1, withscores=True)]
    assert max(scores) <= node_ms(client) + delay + len(entries), scores
    assert due(scripts, NODE, QUEUE) == []  # clamped to now, not to the past: nothing early
    time.sleep(max(0, synced_at + delay + 50 - node_ms(client)) / 1000)
    found = [parse_entry(m) for m in due(scripts, NODE, QUEUE, limit=10)]
    assert sorted(found, key=lambda e: e.offset) == entries
    cursor = client.hget(redo_cursor_key(NODE, QUEUE), "score")
    assert cursor is not None and int(cursor) <= node_ms(client) + delay


@pytest.mark.parametrize("t", ["99999999999999999999", "inf", "1e300", "nan", "-5"])
def test_a_time_that_is_no_millisecond_count_is_the_node_s_now(
    client: redis.Redis, t: str
) -> None:
    client.hset(stock_key(NODE), "sku-a", 10)
    scripts = StockScripts(client)
    entry = scripts.deduct(NODE, QUEUE, "oi-0", "sku-a", 1, "m-1").entry
    later = scripts.deduct(NODE, QUEUE, "oi-1", "sku-a", 1, "m-1").entry
    rewrite_times(client, redo_key(NODE, QUEUE), {0: t})
    before = node_ms(client)
    assert scripts.sync(NODE, QUEUE, delay_ms=60_000) == 2
    after = node_ms(client)
    scores = dict(client.zrange(delay_key(NODE, QUEUE), 0, -1, withscores=True))
    first = scores[format_entry(entry).encode()]
    assert before + 60_000 <= first <= after + 60_000  # the node's now: neither early nor late
    assert scores[format_entry(later).encode()] == first + 1  # still in offset order


def run_ahead_then_fail_over(world: World) -> int:
    """Item p deducted and synced while the node's clock ran years ahead (its delay score and
    the sync cursor with it), then a failover to a node with the right clock; returns now."""
    world.shop.define_sku("sku-a", 10)
    world.rebuild_all()
    t0 = world.clock.now
    world.clock.now = t0 * 1000
    world.shop.place_order("o-p", "m-1", [["p", "sku-a", 1]])
    world.drainers[0].sync(QUEUE)
    world.clock.now = t0
    return t0


def max_score(world: World) -> float:
    members = world.nodes[0].client.zrange(delay_key(NODE, QUEUE), 0, -1, withscores=True)
    return max(score for _, score in members)


@SQLITE
def test_a_node_clock_that_ran_years_ahead_stalls_nothing_after_a_failover(
    world: World,
) -> None:
    now = run_ahead_then_fail_over(world)
    world.shop.place_order("o-q", "m-1", [["q", "sku-a", 1]])
    world.drainers[0].sync(QUEUE)
    assert max_score(world) <= now + DELAY_MS + 2
    world.clock.advance(DELAY_MS + 100)
    world.drainers[0].drain(QUEUE)
    assert world.qty("sku-a", ItemState.RESTOCKED) == 2  # q on time, and p with it
    assert world.stock("sku-a") == 10
    assert world.nodes[0].client.zcard(delay_key(NODE, QUEUE)) == 0
    world.check_conserved()


@SQLITE
def test_a_rebuild_keeps_no_far_future_maximum(world: World) -> None:
    """A rebuild while the poisoned score is queued re-issues p with its far-future time; the
    entries synced after it (p's new one included) still come due on time."""
    now = run_ahead_then_fail_over(world)
    world.shop.place_order("o-q", "m-1", [["q", "sku-a", 1]])
    assert world.rebuilders[0].rebuild(force=True).outcome == "rebuilt"  # re-issues p and q
    world.shop.place_order("o-r", "m-1", [["r", "sku-a", 1]])
    world.drainers[0].sync(QUEUE)
    assert max_score(world) <= now + DELAY_MS + 4
    world.clock.advance(DELAY_MS + 100)
    world.settle()
    assert world.qty("sku-a", ItemState.RESTOCKED) == 3  # p, q and r all back
    assert world.stock("sku-a") == 10
    assert world.nodes[0].client.zcard(delay_key(NODE, QUEUE)) == 0  # p's old entry too
    world.check_conserved()
