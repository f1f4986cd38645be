"""Items a drain left 'released' with their stock back are settled as 'restocked' (the
nemesis' nem-order-93, seed 3: the reply to restock.lua was lost in a Redis black hole, so the
drainer never recorded the item, and no drain would see its entry again). Items whose stock
is not back are left alone: still queued, still on record, or dead-lettered."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import update

from tasks.deadletters.store import DeadLetters
from tasks.restock.drain import DEAD_LETTER_KIND
from tasks.restock.keys import deducted_key, delay_key
from tasks.restock.settle import settle_released
from tasks.restock.tables import ORDER_ITEMS, ItemState
from tests.restock.conftest import DELAY_MS, World


@pytest.fixture
def shop(world: World) -> World:
    world.shop.define_sku("sku-a", 10)  # on node 0 (crc32 routing); m-1 uses q0
    return world


def _item(world: World, item: str) -> tuple[str, str]:
    [row] = [r for r in world.shop._results("o-1") if r.order_item_id == item]
    return row.state, row.entry


def _released(world: World, item: str) -> None:
    """The item as a drain left it after its database's step 3: 'released'."""
    with world.sessions.begin() as session:
        session.execute(update(ORDER_ITEMS).where(ORDER_ITEMS.c.order_item_id == item)
                        .values(state=ItemState.RELEASED))


def test_an_item_whose_drain_lost_its_last_step_is_settled_and_nothing_else(
        shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 1], ["i-2", "sku-a", 2],
                                         ["i-3", "sku-a", 3], ["i-4", "sku-a", 4]])
    node = shop.nodes[0]
    entries = {item: _item(shop, item)[1] for item in ("i-1", "i-2", "i-3", "i-4")}
    shop.clock.advance(DELAY_MS + 100)
    shop.drainers[0].sync("q0")  # the redo log into the delay queue
    queue = delay_key(0, "q0")
    # i-1: restocked by a drain whose last write (step 5) never landed.
    node.client.zrem(queue, entries["i-2"])  # i-2: kept back from the drain, queued again
    node.client.zrem(queue, entries["i-3"])  # i-3: dead-lettered, as discard.lua does it
    node.client.hdel(deducted_key(0), "i-3")
    DeadLetters(shop.sessions).add(DEAD_LETTER_KIND, entries["i-3"], "restock failed 3 times",
                                   {"entry": entries["i-3"]})
    node.client.zrem(queue, entries["i-4"])  # i-4: out of the queue, but still on record
    assert shop.drainers[0].drain("q0").restocked == 1
    node.client.zadd(queue, {entries["i-2"]: 0})
    for item in ("i-1", "i-2", "i-3", "i-4"):
        _released(shop, item)
    stock = shop.stock("sku-a")
    assert settle_released(shop.sessions, shop.nodes, grace=60) == 0  # too recent yet
    time.sleep(0.05)
    assert settle_released(shop.sessions, shop.nodes, grace=0.01) == 1
    assert {item: _item(shop, item)[0] for item in entries} == {
        "i-1": ItemState.RESTOCKED, "i-2": ItemState.RELEASED, "i-3": ItemState.RELEASED,
        "i-4": ItemState.RELEASED}
    assert shop.stock("sku-a") == stock  # the record moved, not the stock
    assert settle_released(shop.sessions, shop.nodes, grace=0.01) == 0
    shop.settle()  # the queued one is drained as usual
    assert _item(shop, "i-2")[0] == ItemState.RESTOCKED
