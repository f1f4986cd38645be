"""Issue 18 item 11 (restock): the rebuild's statements are bounded by items, not by SKUs.

The paid stock used to be summed per chunk of 1,000 SKUs in one GROUP BY, whatever their
history: a shard whose SKUs had tens of millions of paid items ran one statement longer than
the maintenance lease's TTL, lost the lease, and tried again forever. Here the database
charges for every item a statement sums (SQLite's sum() replaced, on this engine only, by
one that takes 30 ms a row): a statement over one SKU's 60 paid items outlasts a 1 s lease,
statements over at most `chunk` items do not."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, event

from tasks.restock.maintenance import Rebuilder, RebuildOutcome
from tasks.restock.tables import ItemState
from tests.restock.conftest import World

SQLITE = pytest.mark.parametrize("db_kind", ["sqlite"])
ROW_COST = 0.03  # seconds per item summed, while `slow` is set
slow = threading.Event()


class CostlySum:
    """sum() that costs ROW_COST per row while `slow` is set (a large history, in small)."""

    def __init__(self) -> None:
        self.total = 0

    def step(self, value: Any) -> None:
        if slow.is_set():
            time.sleep(ROW_COST)
        if value is not None:
            self.total += value

    def finalize(self) -> int:
        return self.total


def charge_per_row(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _install(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        dbapi_connection.create_aggregate("sum", 1, CostlySum)  # type: ignore[arg-type]

    engine.dispose()  # connections made before the listener get it on reconnect


@SQLITE
def test_a_sku_with_a_long_paid_history_is_summed_in_bounded_statements(
    world: World, restock_engine: Engine
) -> None:
    charge_per_row(restock_engine)
    world.shop.define_sku("sku-a", 1000)
    for n in range(60):
        world.shop.place_order(f"o-{n}", "m-1", [[f"i-{n}", "sku-a", 1]])
        world.shop.pay(f"o-{n}")
    world.shop.place_order("o-held", "m-1", [["i-held", "sku-a", 5]])
    reads: list[float] = []
    rebuilder = Rebuilder(world.sessions, world.nodes[0], world.router.queues,
                          lease_ttl=1.0, chunk=5, on_read=lambda: reads.append(time.monotonic()))
    slow.set()
    try:
        report = rebuilder.rebuild(force=True)
    finally:
        slow.clear()
    assert report.outcome == RebuildOutcome.REBUILT, report
    longest = max(b - a for a, b in zip(reads, reads[1:], strict=False))
    assert longest < 0.5, f"a statement summed for {longest:.2f}s"  # <= 5 items each
    assert reads[-1] - reads[0] > 1.0  # the whole read outlasted one TTL
    assert world.stock("sku-a") == 1000 - 60 - 5
    assert world.qty("sku-a", ItemState.PAID) == 60
    world.check_conserved()
