"""Issue 18 item 6: the restock residual window. A place_order that stalls between its Redis
deduction and the database record of it, while the node is restored (restarted empty and
rebuilt, or put back to an older snapshot), used to record a deduction the node no longer
held: the restored node sold the same units again under the same offset, nothing looked
stale, and both orders were paid (20 paid of a total of 10).

place_order now checks, after recording, that each held item's deduction is still on record
on its node, and takes the record back when it is not (the item is 'reserving' again and
the call fails with StockUnavailable, so the task's retry deducts it afresh). It also finds
another order's item recorded at its offset whose deduction the node lost (a restore landed
while this order was deducting on a generation read before that item's record)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from tasks.restock.maintenance import RebuildOutcome
from tasks.restock.scripts import Deduction, StockScripts
from tasks.restock.shop import OrderError, OrderPending, Shop, StockUnavailable
from tasks.restock.tables import ItemState
from tests.restock.conftest import World

EVERY_DATABASE = pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
TOTAL = 10


def snapshot(client: redis.Redis) -> list[tuple[bytes, bytes]]:
    return [(key, client.dump(key)) for key in client.keys("*")]


def restore(client: redis.Redis, saved: list[tuple[bytes, bytes]]) -> None:
    client.flushdb()
    for key, value in saved:
        client.restore(key, 0, value)


def restart_and_rebuild(world: World) -> Callable[[], None]:
    def restore_node() -> None:
        world.servers[0].restart()  # empty: the stalled deduction is gone
        assert world.rebuilders[0].rebuild().outcome == RebuildOutcome.REBUILT
    return restore_node


def back_to_snapshot(world: World) -> Callable[[], None]:
    saved = snapshot(world.nodes[0].client)  # before the stalled deduction

    def restore_node() -> None:
        restore(world.nodes[0].client, saved)
    return restore_node


def place_until_settled(shop: Shop, order_id: str, item: str) -> None:
    """place_order as its Celery task runs it: retried while it raises StockUnavailable."""
    for _ in range(3):
        try:
            shop.place_order(order_id, "m-1", [[item, "sku-a", TOTAL]])
            return
        except StockUnavailable:
            continue
    raise AssertionError(f"{order_id} never settled")


def try_to_pay(world: World, order_id: str) -> None:
    try:
        world.shop.pay(order_id)
    except OrderError:
        pass


class Crash(Exception):
    """The placing process dies after recording its deductions, before checking them."""


@EVERY_DATABASE
@pytest.mark.parametrize("node_restore", [restart_and_rebuild, back_to_snapshot])
@pytest.mark.parametrize("crash", [False, True], ids=["stall", "crash"])
def test_a_deduction_lost_in_a_node_restore_before_its_record_lands_is_not_sold_twice(
    world: World, node_restore: Callable[[World], Callable[[], None]], crash: bool,
) -> None:
    world.shop.define_sku("sku-a", TOTAL)
    world.rebuild_all()
    restore_node = node_restore(world)

    def stall() -> None:  # between p's deduction and its record, the node is restored ...
        restore_node()
        # ... and sells the same units again, under p's offset, and they are paid.
        place_until_settled(world.shop, "o-q", "q")
        world.shop.pay("o-q")
        if crash:
            raise Crash  # p's record lands, its process dies before checking it

    stalled = Shop(world.sessions, [n.scripts for n in world.nodes], world.router,
                   before_settle=stall)
    with pytest.raises(Crash if crash else StockUnavailable):
        stalled.place_order("o-p", "m-1", [["p", "sku-a", TOTAL]])
    place_until_settled(world.shop, "o-p", "p")  # the task's retry, or its redelivery
    try_to_pay(world, "o-p")
    paid, held = world.qty("sku-a", ItemState.PAID), world.qty("sku-a", ItemState.HELD)
    assert paid <= TOTAL, f"{paid} paid of a total of {TOTAL}"
    assert world.stock("sku-a") == TOTAL - held - paid
    assert {r.order_item_id: r.state for r in world.shop._results("o-p")} == {
        "p": ItemState.REJECTED}
    world.check_conserved()


class PausingScripts(StockScripts):
    """A node's scripts that run `pause` once, before the first deduction: the order has read
    the node's generation by then."""

    def __init__(self, client: Any, clock: Callable[[], int],
                 pause: Callable[[], None]) -> None:
        super().__init__(client, clock)
        self.pause: Callable[[], None] | None = pause

    def deduct(self, *args: Any, **kwargs: Any) -> Deduction:
        pause, self.pause = self.pause, None
        if pause is not None:
            pause()
        return super().deduct(*args, **kwargs)


@EVERY_DATABASE
@pytest.mark.parametrize("x_paid", [False, True], ids=["x-held", "x-paid"])
def test_an_offset_handed_out_twice_leaves_one_owner_of_the_units(
    world: World, x_paid: bool
) -> None:
    """q reads the generation, then x is placed (recorded and checked) and maybe paid, then
    the node goes back to a snapshot from before x, and q deducts: the node hands x's offset
    to q. q's check finds x at its offset and not on record: x goes back to 'reserving' (its
    retry finds no stock), or, x being paid, q is rejected and the node rebuilt."""
    world.shop.define_sku("sku-a", TOTAL)
    world.rebuild_all()
    restore_node = back_to_snapshot(world)

    def meanwhile() -> None:
        (x,) = world.shop.place_order("o-x", "m-1", [["x", "sku-a", TOTAL]])
        assert x.state == ItemState.HELD
        if x_paid:
            world.shop.pay("o-x")
        restore_node()

    scripts = [PausingScripts(world.nodes[0].client, world.clock, meanwhile),
               world.nodes[1].scripts]
    try:
        Shop(world.sessions, scripts, world.router).place_order(
            "o-q", "m-1", [["q", "sku-a", TOTAL]])
    except StockUnavailable:
        place_until_settled(world.shop, "o-q", "q")  # its task's retry
    for order_id, item in (("o-x", "x"), ("o-q", "q")):  # each customer pays
        try:
            try_to_pay(world, order_id)
        except OrderPending:  # as it says: place the order again, then pay
            place_until_settled(world.shop, order_id, item)
            try_to_pay(world, order_id)
    paid, held = world.qty("sku-a", ItemState.PAID), world.qty("sku-a", ItemState.HELD)
    assert paid == TOTAL and held == 0, f"{paid} paid of a total of {TOTAL}"
    assert world.rebuilders[0].stale() is x_paid  # marked stale: rebuilt at the next tick
    world.rebuild_all()
    assert world.stock("sku-a") == 0
    world.check_conserved()
