"""The restock scenario of `make demo DEMO_ARGS="--restock"`, on the demo's workers and beat.

Defines three SKUs, places random orders through Celery (`tasks.restock.place_order`), pays a
third of them, and shows each SKU's free stock while beat's sync and drain jobs bring the
unpaid stock back after RESTOCK_DELAY. It then checks that every SKU ends at total - paid and
that no order was restocked twice or left holding stock.
"""

from __future__ import annotations

import random
import time
from typing import Any

from celery import Celery
from rich.console import Console
from rich.live import Live
from rich.table import Table

__all__ = ["SKUS", "run_restock"]

SKUS = {"sku-red": 120, "sku-green": 60, "sku-blue": 30}
MEMBERS = [f"member-{i}" for i in range(6)]


def _call(client: Celery, task: str, *args: Any) -> Any:
    return client.send_task(task, args=args).get(timeout=60)


def _table(views: dict[str, dict[str, Any]], expected: dict[str, int], left: float) -> Table:
    table = Table(title=f"restock: unpaid stock comes back ({max(left, 0):.0f}s to the first)")
    for column in ("sku", "node", "total", "free now", "held unpaid", "paid", "returned",
                   "expected at the end"):
        table.add_column(column, justify="left" if column == "sku" else "right")
    for sku, v in views.items():
        states = v["by_state"]
        table.add_row(sku, str(v["node"]), str(v["total"]), str(v["redis_stock"]),
                      str(states.get("held", 0) + states.get("reserving", 0)),
                      str(states.get("paid", 0)),
                      str(states.get("restocked", 0) + states.get("released", 0)),
                      str(expected[sku]))
    return table


def run_restock(console: Console, broker_url: str, delay: float, orders: int = 40,
                timeout: float = 120) -> bool:
    """Run the scenario against the platform behind `broker_url`; True if it verified."""
    console.rule("restock scenario")
    client = Celery(broker=broker_url, backend=broker_url)
    client.conf.update(task_serializer="json", accept_content=["json"],
                       result_accept_content=["json"])
    rng = random.Random(2)
    try:
        for sku, total in SKUS.items():
            node = _call(client, "tasks.restock.define_sku", sku, total)["node"]
            console.print(f"defined {sku}: {total} units on stock node {node}")
        paid_units = dict.fromkeys(SKUS, 0)
        placed = 0
        for n in range(orders):
            items = [[f"order-{n}-{k}", sku, rng.randint(1, 4)]
                     for k, sku in enumerate(rng.sample(sorted(SKUS), rng.randint(1, 2)))]
            results = _call(client, "tasks.restock.place_order", f"order-{n}",
                            rng.choice(MEMBERS), items)
            placed += sum(1 for r in results if r["state"] == "held")
            if n % 3 == 0:
                for r in _call(client, "tasks.restock.pay", f"order-{n}"):
                    if r["state"] == "paid":
                        paid_units[r["sku_id"]] += r["qty"]
        console.print(f"placed {orders} orders ({placed} items held), paid every third; "
                      f"unpaid items come back after {delay:g}s")
        expected = {sku: total - paid_units[sku] for sku, total in SKUS.items()}
        began = time.monotonic()
        with Live(console=console, refresh_per_second=4) as live:
            while True:
                views = {sku: _call(client, "tasks.restock.inspect", sku) for sku in SKUS}
                live.update(_table(views, expected, delay - (time.monotonic() - began)))
                if all(views[s]["redis_stock"] == expected[s] and
                       views[s]["by_state"].get("held", 0) == 0 for s in SKUS):
                    break
                if time.monotonic() - began > timeout:
                    console.print("[red]timed out waiting for the stock to come back[/]")
                    return False
                time.sleep(0.5)
        ok = all(v["consistent"] for v in views.values())
        console.print()
        console.print(f"stock back after {time.monotonic() - began:.1f}s: every SKU at total - "
                      f"paid ({', '.join(f'{s} {expected[s]}' for s in SKUS)})")
        console.print("[bold green]restocked exactly once: yes[/]" if ok
                      else "[bold red]restocked exactly once: NO[/]")
        return ok
    finally:
        client.close()
