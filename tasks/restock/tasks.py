"""Celery tasks of the restock feature. Beat emits one tick, which syncs every shard
and sends drain and rebuild where they are due (tasks.restock.dispatch); the rest are called by
the shop, or ad hoc (a shard is a number below RESTOCK_SHARDS)::

    celery -A tasks call tasks.restock.define_sku --args '["sku-1", 100]'
    celery -A tasks call tasks.restock.place_order --args '["o-1", "m-1", [["o-1-1", "sku-1", 2]]]'
    celery -A tasks call tasks.restock.pay --args '["o-1"]'
    celery -A tasks call tasks.restock.inspect --args '["sku-1"]'
    celery -A tasks call tasks.restock.sync --args '[0, "q0"]'
    celery -A tasks call tasks.restock.drain --args '[0, "q0"]'
    celery -A tasks call tasks.restock.rebuild --args '[0]' --kwargs '{"force": true}'
    celery -A tasks call tasks.restock.tick

Each task is idempotent: deductions are recorded per order item, payments and releases are
compare-and-sets, restock is offset-checked and drains and rebuilds hold leases, so a
redelivered message (acks_late) changes nothing. Drains and rebuilds that keep killing their
process are capped at REDELIVERY_CAP attempts (per entry, per shard) and dead-lettered.

Arguments are checked here, before any I/O: ids are non-empty strings of at most
ID_MAX_LEN characters (the database columns), quantities integers in 1..MAX_SKU_NUM, a shard
below RESTOCK_SHARDS and a queue one of its names. A bad one fails with
InvalidArguments quoting at most a short prefix of the value.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import redis

from tasks.celery import app, settings
from tasks.observe.metrics import record
from tasks.restock.dispatch import due_work
from tasks.restock.drain import Drainer
from tasks.restock.maintenance import Rebuilder
from tasks.restock.metrics import RestockSeries
from tasks.restock.orders import ID_MAX_LEN, MAX_LINES
from tasks.restock.routing import Router
from tasks.restock.settings import restock_settings
from tasks.restock.settle import settle_released
from tasks.restock.shards import StockShard, stock_shards
from tasks.restock.shop import OrderPending, Shop, StockUnavailable
from tasks.store.resources import resources_for
from tasks.store.validate import InvalidArguments, int_arg, quote, text_arg
from tasks.worker.base import PlatformTask
from tasks.worker.retry import RetryPolicy

__all__ = ["ID_MAX_LEN", "MAX_LINES", "define_sku", "drain", "inspect", "pay", "place_order",
           "rebuild", "router", "sync", "tick"]

# The restock section of the app's settings (RESTOCK_*).
restock = restock_settings(settings)

log = logging.getLogger("tasks.restock")

TOTAL_MAX = 2**53 - 1  # a SKU's total: exact in Lua's numbers

# A shard in maintenance or restarting comes back within seconds; an order waits for it.
SHARD_WAIT = RetryPolicy(max_retries=8, initial_interval=0.5, max_interval=10.0,
                        retry_on=(StockUnavailable, OrderPending))


def router() -> Router:
    return Router(shards=restock.shards, queues=restock.queue_names)


def _shop() -> Shop:
    res = resources_for(settings)
    return Shop(res.sessions, [n.scripts for n in stock_shards(res)], router())


def _shard(shard: Any) -> StockShard:
    index = int_arg("shard", shard, lo=0, hi=restock.shards - 1)
    return stock_shards(resources_for(settings))[index]


def _queue(queue: Any) -> str:
    names = list(restock.queue_names)
    text_arg("queue", queue, max_len=64)
    if queue not in names:
        raise InvalidArguments(f"queue must be one of {names}, got {quote(queue)}")
    return str(queue)


def _id(name: str, value: Any) -> str:
    return text_arg(name, value, max_len=ID_MAX_LEN)


def _drainer(shard: StockShard) -> Drainer:
    return Drainer(
        resources_for(settings).sessions, shard, batch=restock.batch,
        delay_ms=int(restock.delay * 1000), capacity=restock.capacity,
        lease_ttl=settings.lease_ttl, time_slice=min(60.0, settings.soft_time_limit / 2),
        max_attempts=settings.redelivery_cap,
    )


def _items(results: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in results]


@app.task(name="tasks.restock.define_sku")
def define_sku(sku_id: str, total: int) -> dict[str, Any]:
    """Create a SKU with `total` units (idempotent)."""
    _id("sku_id", sku_id)
    int_arg("total", total, lo=0, hi=TOTAL_MAX)
    return {"sku_id": sku_id, "node": _shop().define_sku(sku_id, total)}


@app.task(name="tasks.restock.place_order", base=PlatformTask, retry_policy=SHARD_WAIT)
def place_order(order_id: str, member_id: str, items: list[list[Any]]) -> list[dict[str, Any]]:
    """Deduct every item ([order_item_id, sku_id, qty]) of an order; retried while a shard is
    in maintenance or unreachable. The items are validated once, by the shop
    (`tasks.restock.orders.order_lines`: `InvalidOrder`, an `InvalidArguments`)."""
    _id("order_id", order_id)
    _id("member_id", member_id)
    return _items(_shop().place_order(order_id, member_id, items))


@app.task(name="tasks.restock.pay", base=PlatformTask, retry_policy=SHARD_WAIT)
def pay(order_id: str) -> list[dict[str, Any]]:
    """Pay an order (refused with OrderExpired once its stock went back)."""
    return _items(_shop().pay(_id("order_id", order_id)))


@app.task(name="tasks.restock.inspect")
def inspect(sku_id: str) -> dict[str, Any]:
    """A SKU's total, its free stock in Redis, and its quantities by item state."""
    view = _shop().inspect(_id("sku_id", sku_id))
    return {**view.as_dict(), "consistent": view.consistent}


@app.task(name="tasks.restock.sync")
def sync(shard: int, queue: str) -> dict[str, Any]:
    """Move a shard queue's redo log into its delay queue (stops at FULL or MAINTAINING)."""
    found = _shard(shard)
    return _drainer(found).sync(_queue(queue)).as_dict()


@app.task(name="tasks.restock.drain", acks_late=True)
def drain(shard: int, queue: str) -> dict[str, Any]:
    """Restock a shard queue's due entries under its lease (a second drainer: 'busy')."""
    found = _shard(shard)
    report = _drainer(found).drain(_queue(queue))
    if record.on is not None:
        labels = (str(report.shard), report.queue)
        series = record.on.of(RestockSeries)
        for status, n in report.statuses.items():
            series.restocked.labels(*labels, status).inc(n)
        series.restock_dead_letters.labels(*labels).inc(report.dead_lettered)
    return report.as_dict()


@app.task(name="tasks.restock.rebuild", acks_late=True)
def rebuild(shard: int, force: bool = False) -> dict[str, Any]:
    """Rebuild a shard's stock from the database when its maintenance window is due."""
    found = _shard(shard)
    if not isinstance(force, bool):
        raise InvalidArguments(f"force must be true or false, got {quote(force)}")
    res = resources_for(settings)
    rebuilder = Rebuilder(res.sessions, found, restock.queue_names,
                          every_ms=int(restock.maintenance_every * 1000),
                          lease_ttl=settings.lease_ttl, max_attempts=settings.redelivery_cap)
    return rebuilder.rebuild(force=force).as_dict()


@app.task(name="tasks.restock.tick")
def tick() -> dict[str, Any]:
    """Beat's restock message: sync every shard, settle items a drain left 'released'
    (tasks.restock.settle), send drain and rebuild where due."""
    res = resources_for(settings)
    shards = stock_shards(res)
    queues = restock.queue_names
    synced = 0
    for shard in shards:
        drainer = _drainer(shard)
        try:
            synced += sum(drainer.sync(queue).moved for queue in queues)
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # its master is away
            log.warning("tick: shard %d not synced: %s", shard.number, exc)
    try:
        settled = settle_released(res.sessions, shards, grace=settings.lease_ttl)
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # the next tick settles them
        log.warning("tick: released items not settled: %s", exc)
        settled = 0
    work = due_work(res.sessions, shards, queues)
    for number, queue in work.drains:
        drain.apply_async((number, queue), expires=max(restock.interval, 1.0))
    for number in work.rebuilds:
        rebuild.apply_async((number,), expires=max(restock.interval, 1.0))
    return {"synced": synced, "settled": settled, **work.as_dict()}
