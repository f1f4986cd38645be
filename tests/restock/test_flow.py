"""The restock flow in process, on two real Redis nodes and a real database: order, pay,
sync, drain, rebuild; bad input; Redis and queue trouble."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from sqlalchemy.orm import sessionmaker

from lease import Leases
from tasks.deadletters.store import DeadLetters
from tasks.restock.drain import DEAD_LETTER_KIND, MAX_ATTEMPTS, Drainer, DrainOutcome
from tasks.restock.keys import (
    delay_key,
    drain_lease_name,
    maintenance_lease_name,
    redo_cursor_key,
    redo_key,
    stock_key,
    term_key,
)
from tasks.restock.maintenance import RebuildOutcome
from tasks.restock.orders import OrderError, order_lines
from tasks.restock.redolog import parse_entry
from tasks.restock.replies import HAS_BEEN_CONSUMED, PAID, SUCCESS, WRONG_TERM, UnknownSku
from tasks.restock.shop import (
    DuplicateOrderItem,
    InvalidOrder,
    OrderExpired,
    StockUnavailable,
    UnknownOrder,
)
from tasks.restock.tables import ItemState
from tasks.store.resources import make_engine
from tasks.store.validate import InvalidArguments
from tests.restock.conftest import DELAY_MS, World

# sku-a and sku-b live on node 0, sku-d on node 1 (crc32 routing); m-1 uses q0, m-4 uses q1.


@pytest.fixture
def shop(world: World) -> World:
    for sku, total in (("sku-a", 10), ("sku-b", 5), ("sku-d", 8)):
        world.shop.define_sku(sku, total)
    return world


def states(world: World, order_id: str) -> dict[str, str]:
    return {r.order_item_id: r.state for r in world.shop._results(order_id)}


def test_unpaid_items_come_back_after_the_delay_and_paid_ones_stay_sold(shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3], ["i-2", "sku-d", 2]])
    shop.shop.place_order("o-2", "m-4", [["i-3", "sku-a", 4]])
    assert (shop.stock("sku-a"), shop.stock("sku-d")) == (3, 6)
    shop.shop.pay("o-2")
    shop.check_conserved()
    shop.settle()  # nothing is due yet
    assert (shop.stock("sku-a"), shop.stock("sku-d")) == (3, 6)
    assert states(shop, "o-1") == {"i-1": ItemState.HELD, "i-2": ItemState.HELD}
    shop.clock.advance(DELAY_MS + 100)
    shop.settle()
    assert (shop.stock("sku-a"), shop.stock("sku-d")) == (6, 8)
    assert states(shop, "o-1") == {"i-1": ItemState.RESTOCKED, "i-2": ItemState.RESTOCKED}
    assert states(shop, "o-2") == {"i-3": ItemState.PAID}
    shop.check_conserved()
    for node in shop.nodes:
        for queue in shop.router.queues:
            assert node.client.zcard(delay_key(node.number, queue)) == 0
    view = shop.shop.inspect("sku-a")
    assert (view.total, view.redis_stock, view.by_state) == (
        10, 6, {ItemState.RESTOCKED: 3, ItemState.PAID: 4})
    assert view.consistent


def test_payment_after_the_release_is_refused(shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    shop.clock.advance(DELAY_MS + 100)
    shop.settle()
    with pytest.raises(OrderExpired):
        shop.shop.pay("o-1")
    assert shop.stock("sku-a") == 10
    shop.check_conserved()


def test_a_retried_order_and_payment_change_nothing(shop: World) -> None:
    first = shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    again = shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    assert first == again and shop.stock("sku-a") == 7
    assert shop.shop.pay("o-1") == shop.shop.pay("o-1")
    shop.clock.advance(DELAY_MS + 100)
    shop.settle()
    assert shop.stock("sku-a") == 7
    shop.check_conserved()


def test_insufficient_stock_rejects_the_item_and_holds_nothing(shop: World) -> None:
    (item,) = shop.shop.place_order("o-1", "m-1", [["i-1", "sku-b", 6]])
    assert item.state == ItemState.REJECTED and "INSUFFICIENT" in (item.reason or "")
    assert shop.stock("sku-b") == 5
    with pytest.raises(OrderExpired):
        shop.shop.pay("o-1")
    shop.check_conserved()


@pytest.mark.parametrize(
    ("items", "error"),
    [
        ([], InvalidOrder),
        ("i-1", InvalidOrder),
        ([["i-1", "sku-a"]], InvalidOrder),
        ([["i-1", "sku-a", 0]], InvalidOrder),
        ([["i-1", "sku-a", -2]], InvalidOrder),
        ([["i-1", "sku-a", 10**9]], InvalidOrder),
        ([["i-1", "sku-a", 1.5]], InvalidOrder),
        ([["i-1", "sku-a", True]], InvalidOrder),
        ([["i:1", "sku-a", 1]], InvalidOrder),
        ([["i-1", "", 1]], InvalidOrder),
        ([["i-1", "sku-a", 1], ["i-1", "sku-b", 1]], DuplicateOrderItem),
        ([["i-1", "sku-nope", 1]], UnknownSku),
    ],
)
def test_bad_orders_are_refused_and_change_nothing(
    shop: World, items: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        shop.shop.place_order("o-1", "m-1", items)
    assert shop.stock("sku-a") == 10 and shop.stock("sku-b") == 5
    with pytest.raises(UnknownOrder):
        shop.shop.pay("o-1")


def test_a_bad_order_line_is_one_exception_for_the_shop_and_the_worker() -> None:
    """One check, one type: callers of the shop catch an OrderError, the task boundary an
    InvalidArguments; the message names the field and the line."""
    with pytest.raises(InvalidOrder, match=r"qty must be in 1\.\.\d+, got -1 \(order item") as bad:
        order_lines([["i-1", "sku-a", -1]])
    assert isinstance(bad.value, OrderError) and isinstance(bad.value, InvalidArguments)
    with pytest.raises(InvalidOrder, match="order_item_id is 200 characters"):
        order_lines([["i" * 200, "sku-a", 1]])


def test_an_order_item_id_cannot_move_to_another_order(shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 1]])
    with pytest.raises(DuplicateOrderItem):
        shop.shop.place_order("o-2", "m-1", [["i-1", "sku-a", 1]])
    with pytest.raises(DuplicateOrderItem):
        shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 2]])
    with pytest.raises(InvalidOrder):
        shop.shop.place_order("o-1", "m-4", [["i-1", "sku-a", 1]])
    assert shop.stock("sku-a") == 9
    with pytest.raises(UnknownSku):
        shop.shop.inspect("sku-nope")


def test_redis_down_during_deduction_loses_no_stock(shop: World) -> None:
    shop.servers[0].kill()
    with pytest.raises(StockUnavailable, match="unreachable"):
        shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    assert states(shop, "o-1") == {"i-1": ItemState.RESERVING}
    shop.servers[0].start()  # back, empty: no stock until the node's rebuild
    with pytest.raises(StockUnavailable, match="rebuild"):
        shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    assert shop.rebuilders[0].rebuild().outcome == RebuildOutcome.REBUILT  # due: no schedule
    assert shop.stock("sku-a") == 10  # the reserving item had not been deducted
    (item,) = shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    assert item.state == ItemState.HELD and shop.stock("sku-a") == 7
    shop.check_conserved()


def test_a_full_queue_keeps_entries_in_the_log_until_there_is_room(world: World) -> None:
    world.capacity = 2
    world.connect()
    world.shop.define_sku("sku-a", 10)
    for i in range(5):
        world.shop.place_order(f"o-{i}", "m-1", [[f"i-{i}", "sku-a", 1]])
    report = world.drainers[0].sync("q0", count=1)
    assert (report.moved, report.refused) == (2, "FULL")
    client = world.nodes[0].client
    assert len(client.xrange(redo_key(0, "q0"), min=b"(" + client.hget(
        redo_cursor_key(0, "q0"), "id"))) == 3  # the refused entries wait in the log
    world.clock.advance(DELAY_MS + 10)  # due times of one queue are spaced by at least 1 ms
    for _ in range(3):
        world.settle()
    assert world.stock("sku-a") == 10
    world.check_conserved()


def test_malformed_entries_are_dead_lettered_and_the_rest_restocked(shop: World) -> None:
    client = shop.nodes[0].client
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    client.xadd(redo_key(0, "q0"), {"e": "i-x:0:q0:1:sku-a:oops:1:0:m-1", "t": shop.clock()})
    client.xadd(redo_key(0, "q0"), {"junk": "1"})
    client.xadd(redo_key(0, "q0"), {"e": "i-y:1:q0:9:sku-a:1:1:0:m-1", "t": shop.clock()})
    shop.clock.advance(DELAY_MS + 100)
    shop.settle()
    assert shop.stock("sku-a") == 10
    letters = DeadLetters(shop.sessions).list(DEAD_LETTER_KIND)
    reasons = sorted(letter.reason for letter in letters)
    assert len(letters) == 3
    assert any("sku_num must be an integer" in r for r in reasons)
    assert any("must have 9" in r for r in reasons)
    assert any("entry of shard 1" in r for r in reasons)
    assert client.zcard(delay_key(0, "q0")) == 0


def test_an_entry_that_keeps_failing_is_dead_lettered_after_three_attempts(shop: World) -> None:
    client = shop.nodes[0].client
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3], ["i-2", "sku-b", 1]])
    client.hset(stock_key(0), "sku-b", "corrupt")
    shop.clock.advance(DELAY_MS + 100)
    drainer = shop.drainers[0]
    drainer.sync("q0")
    report = drainer.drain("q0")
    assert report.outcome == DrainOutcome.DRAINED
    assert (report.retried, report.dead_lettered) == (MAX_ATTEMPTS - 1, 1)
    assert shop.stock("sku-a") == 10
    (letter,) = DeadLetters(shop.sessions).list(DEAD_LETTER_KIND)
    assert parse_entry(letter.payload["entry"]).order_item_id == "i-2"
    assert "failed 3 times" in letter.reason and "not an integer" in letter.reason


def test_one_drainer_per_queue(shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    shop.clock.advance(DELAY_MS + 100)
    other = Leases(shop.nodes[0].client)
    try:
        held = other.acquire(drain_lease_name(0, "q0"), ttl=5.0)
        shop.drainers[0].sync("q0")
        assert shop.drainers[0].drain("q0").outcome == DrainOutcome.BUSY
        held.release()
    finally:
        other.close()
    assert shop.drainers[0].drain("q0").restocked == 1


def test_maintenance_window_stops_deduct_sync_and_drain(shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    shop.clock.advance(DELAY_MS + 100)
    rebuilder = Leases(shop.nodes[0].client)
    try:
        window = rebuilder.acquire(maintenance_lease_name(0), ttl=5.0)
        with pytest.raises(StockUnavailable, match="maintenance"):
            shop.shop.place_order("o-2", "m-1", [["i-2", "sku-a", 1]])
        assert shop.drainers[0].sync("q0").refused == "MAINTAINING"
        window.release()
        shop.drainers[0].sync("q0")
        window = rebuilder.acquire(maintenance_lease_name(0), ttl=5.0)
        assert shop.drainers[0].drain("q0").outcome == DrainOutcome.MAINTAINING
        assert shop.rebuilders[0].rebuild(force=True).outcome == RebuildOutcome.BUSY
        window.release()
    finally:
        rebuilder.close()
    shop.settle()
    assert shop.stock("sku-a") == 10
    shop.check_conserved()


def test_rebuild_recounts_from_the_database_and_bumps_the_term(shop: World) -> None:
    client = shop.nodes[0].client
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])  # stays unpaid
    shop.shop.place_order("o-2", "m-4", [["i-2", "sku-a", 2]])
    shop.shop.pay("o-2")
    shop.drainers[0].sync("q0")
    client.hset(stock_key(0), "sku-a", 999)  # Redis drifted from the truth
    report = shop.rebuilders[0].rebuild()
    assert report.outcome == RebuildOutcome.REBUILT and report.reissued == 1
    assert int(client.get(term_key(0)) or 0) == report.term == 1
    assert shop.stock("sku-a") == 5
    assert shop.rebuilders[0].rebuild().outcome == RebuildOutcome.NOT_DUE
    shop.clock.advance(DELAY_MS + 100)
    statuses = []
    for queue in shop.router.queues:
        shop.drainers[0].sync(queue)
        statuses.append(shop.drainers[0].drain(queue).statuses)
    merged = statuses[0] + statuses[1]
    # q0: the old entry of i-1 (WRONG_TERM) and its re-issued one (SUCCESS); q1: paid i-2.
    assert merged == {WRONG_TERM: 2, SUCCESS: 1}
    assert shop.stock("sku-a") == 8
    shop.check_conserved()
    # The term only grows, even when Redis comes back empty.
    shop.servers[0].restart()
    assert shop.rebuilders[0].rebuild().term == 2


def test_a_duplicate_redo_delivery_is_consumed_once(shop: World) -> None:
    (item,) = shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    shop.clock.advance(DELAY_MS + 100)
    shop.settle()
    client = shop.nodes[0].client
    client.zadd(delay_key(0, "q0"), {item.entry or "": 1})  # the same entry again
    drainer = shop.drainers[0]
    assert drainer.drain("q0").statuses == {HAS_BEEN_CONSUMED: 1}
    assert shop.stock("sku-a") == 10


def test_paid_entry_is_removed_without_restock(shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    shop.shop.pay("o-1")
    shop.clock.advance(DELAY_MS + 100)
    shop.drainers[0].sync("q0")
    assert shop.drainers[0].drain("q0").statuses == {PAID: 1}
    assert shop.stock("sku-a") == 7


def test_redis_down_during_drain_stops_without_loss(shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    shop.clock.advance(DELAY_MS + 100)
    shop.drainers[0].sync("q0")
    shop.servers[0].pause()
    try:
        report = shop.drainers[0].drain("q0")
    finally:
        shop.servers[0].resume()
    assert report.outcome == DrainOutcome.UNAVAILABLE
    with pytest.raises(redis.ResponseError):  # the client itself is fine afterwards
        shop.nodes[0].client.execute_command("NOSUCHCOMMAND")
    shop.settle()
    assert shop.stock("sku-a") == 10
    shop.check_conserved()


def test_database_away_during_drain_stops_without_loss(shop: World) -> None:
    shop.shop.place_order("o-1", "m-1", [["i-1", "sku-a", 3]])
    shop.clock.advance(DELAY_MS + 100)
    shop.drainers[0].sync("q0")
    gone = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/test",
                       connect_args={"connect_timeout": 1})
    try:
        away = Drainer(sessionmaker(gone), shop.nodes[0], delay_ms=DELAY_MS)
        assert away.drain("q0").outcome == DrainOutcome.UNAVAILABLE
    finally:
        gone.dispose()
    assert shop.nodes[0].client.zcard(delay_key(0, "q0")) == 1  # still queued
    assert shop.drainers[0].drain("q0").restocked == 1
    assert shop.stock("sku-a") == 10


def test_concurrent_copies_of_one_order_deduct_once(shop: World) -> None:
    """A redelivered place_order running alongside the first copy."""
    items = [["i-1", "sku-a", 3], ["i-2", "sku-d", 2]]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: shop.shop.place_order("o-1", "m-1", items),
                                range(4)))
    assert all(r == results[0] for r in results)
    assert (shop.stock("sku-a"), shop.stock("sku-d")) == (7, 6)
    shop.check_conserved()
