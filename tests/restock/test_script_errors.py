"""Issue 18 item 7: an error inside restock.lua half-way through a batch. Redis does not roll a
script back, so entries applied before the error used to come back HAS_BEEN_CONSUMED when the
drainer retried them one by one and stayed 'released' in the database though their stock was
back; a key of the wrong type found after the first write returned stock twice.

restock.lua now raises nothing after its first write: the entries it applied are reported as
such, and an entry it cannot apply is FAILED with nothing written for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import redis

from tasks.deadletters.store import DeadLetters
from tasks.restock.drain import DEAD_LETTER_KIND, MAX_ATTEMPTS, Drainer
from tasks.restock.keys import attempts_key, delay_key, drain_lock_key, offsets_key, stock_key
from tasks.restock.redolog import RedoEntry, parse_entry
from tasks.restock.replies import FAILED, SUCCESS, Action
from tasks.restock.scripts import StockScripts
from tasks.restock.tables import ItemState
from tests.restock.conftest import DELAY_MS, FakeClockMs, World
from tests.support.redis_server import RedisServer

SQLITE = pytest.mark.parametrize("db_kind", ["sqlite"])
NODE, QUEUE = 0, "q0"
TOKEN = "t" * 32


def place_three(world: World) -> None:
    """i-1 (sku-a), i-2 (sku-b), i-3 (sku-a), one batch of node 0's queue q0 in that order."""
    for sku, total in (("sku-a", 10), ("sku-b", 5)):
        world.shop.define_sku(sku, total)
    for n, sku in ((1, "sku-a"), (2, "sku-b"), (3, "sku-a")):
        world.shop.place_order(f"o-{n}", "m-1", [[f"i-{n}", sku, n]])
    world.clock.advance(DELAY_MS + 100)
    world.drainers[0].sync(QUEUE)


def item_states(world: World) -> dict[str, str]:
    return {r.order_item_id: r.state for n in (1, 2, 3) for r in world.shop._results(f"o-{n}")}


@pytest.mark.parametrize(("corrupt", "reason"), [
    (stock_key, "not an integer"),  # HINCRBY refuses it
    (lambda node: offsets_key(node, QUEUE), "not a number"),  # the offset check cannot read it
])
def test_an_entry_that_cannot_be_applied_fails_alone_and_the_rest_are_applied(
    private_redis: RedisServer, corrupt: Callable[[int], str], reason: str,
) -> None:
    client = redis.Redis(port=private_redis.port)
    scripts = StockScripts(client, FakeClockMs())
    client.hset(stock_key(NODE), mapping={"sku-a": 10, "sku-b": 5})
    entries = [scripts.deduct(NODE, QUEUE, f"i-{n}", sku, 1, "m-1").entry
               for n, sku in ((1, "sku-a"), (2, "sku-b"), (3, "sku-a"))]
    scripts.sync(NODE, QUEUE, delay_ms=0)
    client.set(drain_lock_key(NODE, QUEUE), TOKEN)
    client.hset(corrupt(NODE), "sku-b", "corrupt")
    results = scripts.restock(NODE, QUEUE, TOKEN, [(e, False) for e in entries])
    assert [(r.status, r.action) for r in results] == [
        (SUCCESS, Action.RESTOCKED), (FAILED, Action.FAILED), (SUCCESS, Action.RESTOCKED)]
    assert reason in results[1].detail
    assert int(client.hget(stock_key(NODE), "sku-a") or 0) == 10
    queued = [parse_entry(m) for m in client.zrange(delay_key(NODE, QUEUE), 0, -1)]
    assert queued == [entries[1]]  # nothing written for the failed one: still queued
    client.close()


@SQLITE
def test_entries_applied_before_a_failing_one_are_recorded_restocked(world: World) -> None:
    place_three(world)
    world.nodes[0].client.hset(stock_key(NODE), "sku-b", "corrupt")  # i-2's HINCRBY fails
    report = world.drainers[0].drain(QUEUE)
    assert report.restocked == 2 and report.dead_lettered == 1
    assert report.retried == MAX_ATTEMPTS - 1
    assert world.stock("sku-a") == 10  # i-1 and i-3 back, once each
    assert item_states(world) == {"i-1": ItemState.RESTOCKED, "i-2": ItemState.RELEASED,
                                  "i-3": ItemState.RESTOCKED}
    (letter,) = DeadLetters(world.sessions).list(DEAD_LETTER_KIND)
    assert parse_entry(letter.payload["entry"]).order_item_id == "i-2"
    assert "not an integer" in letter.reason


@SQLITE
def test_a_key_of_the_wrong_type_returns_no_stock_twice(world: World) -> None:
    """The attempts hash turns into a string between the drainer's take and its restock (a
    real WRONGTYPE inside restock.lua, after the first entry's stock write as it was): nothing
    is restocked then, and once the key is repaired every entry comes back exactly once."""
    place_three(world)
    client = world.nodes[0].client

    def clobber(_batch: Sequence[RedoEntry]) -> None:
        client.delete(attempts_key(NODE, QUEUE))
        client.set(attempts_key(NODE, QUEUE), "not a hash")

    drainer = Drainer(world.sessions, world.nodes[0], batch=7, delay_ms=DELAY_MS,
                      lease_ttl=2.0, before_restock=clobber)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        drainer.drain(QUEUE)  # the next take meets the string too: the drain stops
    assert world.stock("sku-a") == 6 and world.stock("sku-b") == 3  # nothing came back
    client.delete(attempts_key(NODE, QUEUE))
    world.drainers[0].drain(QUEUE)
    assert world.stock("sku-a") == 10 and world.stock("sku-b") == 5
    assert set(item_states(world).values()) == {ItemState.RESTOCKED}
    assert client.zcard(delay_key(NODE, QUEUE)) == 0
    world.check_conserved()
