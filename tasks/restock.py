"""Celery tasks of the restock feature (seed 002). Beat emits sync, drain and rebuild; the rest
are called by the shop, or ad hoc::

    celery -A tasks call tasks.restock.define_sku --args '["sku-1", 100]'
    celery -A tasks call tasks.restock.place_order --args '["o-1", "m-1", [["o-1-1", "sku-1", 2]]]'
    celery -A tasks call tasks.restock.pay --args '["o-1"]'
    celery -A tasks call tasks.restock.inspect --args '["sku-1"]'
    celery -A tasks call tasks.restock.sync --args '[0, "q0"]'
    celery -A tasks call tasks.restock.drain --args '[0, "q0"]'
    celery -A tasks call tasks.restock.rebuild --args '[0]' --kwargs '{"force": true}'

Each task is idempotent: deductions are recorded per order item, payments and releases are
compare-and-sets, restock is offset-checked and drains and rebuilds hold leases, so a
redelivered message (acks_late) changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tasks.app import app, settings
from tasks.base import PlatformTask
from tasks.drain import Drainer
from tasks.jobs import InvalidArguments
from tasks.maintenance import Rebuilder
from tasks.nodes import StockNode
from tasks.resources import resources_for
from tasks.retry import RetryPolicy
from tasks.shop import OrderPending, Router, Shop, StockUnavailable

__all__ = ["define_sku", "drain", "inspect", "pay", "place_order", "rebuild", "router",
           "sync"]

# A node in maintenance or restarting comes back within seconds; an order waits for it.
NODE_WAIT = RetryPolicy(max_retries=8, initial_interval=0.5, max_interval=10.0,
                        retry_on=(StockUnavailable, OrderPending))


def router() -> Router:
    return Router(nodes=len(settings.restock_nodes), queues=settings.restock_queues)


def _shop() -> Shop:
    res = resources_for(settings)
    return Shop(res.sessions, [n.scripts for n in res.stock_nodes], router())


def _node(node: Any) -> StockNode:
    count = len(settings.restock_nodes)
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < count:
        raise InvalidArguments(f"node must be an integer in 0..{count - 1}, got {node!r}")
    return resources_for(settings).stock_nodes[node]


def _queue(queue: Any) -> str:
    names = router().queue_names()
    if queue not in names:
        raise InvalidArguments(f"queue must be one of {names}, got {queue!r}")
    return str(queue)


def _drainer(node: StockNode) -> Drainer:
    return Drainer(
        resources_for(settings).sessions, node, batch=settings.restock_batch,
        delay_ms=int(settings.restock_delay * 1000), capacity=settings.restock_capacity,
        lease_ttl=settings.lease_ttl, time_slice=min(60.0, settings.soft_time_limit / 2),
    )


def _items(results: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in results]


@app.task(name="tasks.restock.define_sku")
def define_sku(sku_id: str, total: int) -> dict[str, Any]:
    """Create a SKU with `total` units (idempotent)."""
    return {"sku_id": sku_id, "node": _shop().define_sku(sku_id, total)}


@app.task(name="tasks.restock.place_order", base=PlatformTask, retry_policy=NODE_WAIT)
def place_order(order_id: str, member_id: str, items: list[list[Any]]) -> list[dict[str, Any]]:
    """Deduct every item ([order_item_id, sku_id, qty]) of an order; retried while a node is
    in maintenance or unreachable."""
    return _items(_shop().place_order(order_id, member_id, items))


@app.task(name="tasks.restock.pay", base=PlatformTask, retry_policy=NODE_WAIT)
def pay(order_id: str) -> list[dict[str, Any]]:
    """Pay an order (refused with OrderExpired once its stock went back)."""
    return _items(_shop().pay(order_id))


@app.task(name="tasks.restock.inspect")
def inspect(sku_id: str) -> dict[str, Any]:
    """A SKU's total, its free stock in Redis, and its quantities by item state."""
    view = _shop().inspect(sku_id)
    return {**dataclasses.asdict(view), "consistent": view.consistent}


@app.task(name="tasks.restock.sync")
def sync(node: int, queue: str) -> dict[str, Any]:
    """Move a queue's redo log into its delay queue (stops at FULL or MAINTAINING)."""
    found = _node(node)
    return _drainer(found).sync(_queue(queue)).as_dict()


@app.task(name="tasks.restock.drain", acks_late=True)
def drain(node: int, queue: str) -> dict[str, Any]:
    """Restock a queue's due entries under its lease (a second drainer returns 'busy')."""
    found = _node(node)
    return _drainer(found).drain(_queue(queue)).as_dict()


@app.task(name="tasks.restock.rebuild", acks_late=True)
def rebuild(node: int, force: bool = False) -> dict[str, Any]:
    """Rebuild a node's stock from the database when its maintenance window is due."""
    found = _node(node)
    res = resources_for(settings)
    rebuilder = Rebuilder(res.sessions, found, router().queue_names(),
                          every_ms=int(settings.maintenance_every * 1000),
                          lease_ttl=settings.lease_ttl)
    return rebuilder.rebuild(force=bool(force)).as_dict()
