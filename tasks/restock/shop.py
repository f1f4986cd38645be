"""Orders and their stock: define SKUs, place orders, pay them, inspect a SKU.

The database is the source of truth for SKUs' total stock, orders, order items and payments;
Redis holds the stock that is free right now. Placing an order records its items first
(state `reserving`), then deducts each one in Redis with deduct.lua (which appends the redo
entry the drainer later restocks from), then records the outcome::

    place_order   DB: items 'reserving'  ->  Redis: deduct.lua per item  ->  DB: 'held'
                  ->  Redis: each held item's deduction still on record? (else 'reserving')
    pay           DB: 'held' -> 'paid' for every item of the order, one transaction
    drainer       DB: 'held' -> 'released' (unpaid past the delay)  ->  Redis: restock.lua

Payment and release are compare-and-sets on the item's state, so for any item exactly one of
them wins: a payment that comes after the release is refused (OrderExpired) and a release
after the payment finds the item paid. Every step can be repeated: a retried place_order
finds its items in the database and gets each deduction on record back from Redis.

Time: an item's time is its deduction's, stamped by the stock shard's clock inside deduct.lua;
this module reads no clock for any decision (``utcnow`` only stamps rows).

Generation: each deduction passes the shard's generation as the database knows it (the term
of its last rebuild, the highest offset an item recorded); a shard behind it refuses (STALE)
until rebuilt, so a shard restored from an older snapshot cannot sell the same stock twice.
A deduction the shard lost before the database recorded it is caught by the check after
recording (tasks.restock.holds).

Routing: the `Router` (tasks.restock.routing) picks a SKU's shard and a member's delay queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tasks.restock.holds import check_holds, recorded_generation
from tasks.restock.keys import stock_key
from tasks.restock.orders import DuplicateOrderItem, InvalidOrder, Line, OrderError, order_lines
from tasks.restock.redolog import RedoEntry, check_id, format_entry
from tasks.restock.replies import InsufficientStock, NodeMaintaining, NodeStale, UnknownSku
from tasks.restock.routing import Router
from tasks.restock.scripts import Generation, StockScripts
from tasks.restock.tables import ORDER_ITEMS, ORDERS, PAYMENTS, SKUS, ItemState
from tasks.store.db import WRITE_INTENT, utcnow
from tasks.store.validate import quote

__all__ = [
    "DuplicateOrderItem",
    "InvalidOrder",
    "ItemResult",
    "OrderError",
    "OrderExpired",
    "OrderPending",
    "Shop",
    "SkuView",
    "StockUnavailable",
    "UnknownOrder",
]


class UnknownOrder(OrderError):
    """No such order."""


class OrderExpired(OrderError):
    """The order was not paid in time: its stock went back, so it can no longer be paid."""


class OrderPending(RuntimeError):
    """Some item's deduction is not confirmed yet; retry once place_order has finished."""


class StockUnavailable(RuntimeError):
    """A stock shard cannot take the deduction now (unreachable, in maintenance, or restarted
    and not rebuilt yet); the item stays 'reserving' and a retry completes it."""


@dataclass(frozen=True)
class ItemResult:
    order_item_id: str
    sku_id: str
    qty: int
    state: str
    entry: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class SkuView:
    """A SKU's stock, in Redis and by the state of its order items (quantities)."""

    sku_id: str
    shard: int
    total: int
    redis_stock: int | None
    by_state: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The view as `tasks.restock.inspect` returns it: the shard under its wire name,
        ``node`` (docs/decisions.md, "Ranges and restock: one name per thing")."""
        return {("node" if k == "shard" else k): v for k, v in asdict(self).items()}

    @property
    def consistent(self) -> bool:
        """At a quiet moment: free + held (incl. being released) + paid == total."""
        out = sum(self.by_state.get(s, 0) for s in (ItemState.HELD, ItemState.PAID,
                                                        ItemState.RESERVING))
        return self.redis_stock is not None and self.redis_stock + out == self.total


@dataclass(frozen=True)
class _Outcome:
    """One deduction's result, to record: the item's new state, its entry (held) or reason."""

    order_item_id: str
    state: str
    entry: RedoEntry | None
    reason: str | None


def _id(field_name: str, value: Any) -> str:
    try:
        return check_id(field_name, value)
    except ValueError as exc:
        raise InvalidOrder(str(exc)) from None


class Shop:
    """The restock feature's user-facing API. `shards[i]` runs the scripts of shard i (on its
    Redis: several shards may share one client).

    `before_settle` is a test seam run after an order's deductions, before they are recorded
    (a stall; what it raises propagates once they are recorded, unchecked, as when the
    process dies there).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        shards: Sequence[StockScripts],
        router: Router,
        before_settle: Callable[[], None] | None = None,
    ) -> None:
        if len(shards) != router.shards:
            raise ValueError(f"{len(shards)} shard clients for a router of {router.shards} shards")
        self.sessions = sessions
        self.shards = list(shards)
        self.router = router
        self.before_settle = before_settle

    # SKUs --------------------------------------------------------------------------------

    def define_sku(self, sku_id: str, total: int) -> int:
        """Create SKU `sku_id` with `total` units (idempotent); return its shard.

        The database row comes first. Only the call that creates the SKU writes its stock
        (no item can hold any of it yet, so total is what is free); a repeated call never
        touches Redis: after an empty restart that would hand out stock that held and paid
        items already took. A shard missing the SKU's stock is due for a rebuild instead.
        """
        _id("sku_id", sku_id)
        if isinstance(total, bool) or not isinstance(total, int) or not 0 <= total < 2**53:
            raise InvalidOrder(f"total must be a non-negative integer, got {quote(total)}")
        shard = self.router.shard_for(sku_id)
        with self.sessions.begin() as session:
            session.connection(execution_options=WRITE_INTENT)
            found = session.execute(select(SKUS.c.total).where(SKUS.c.sku_id == sku_id)).first()
            if found is None:
                session.execute(insert(SKUS).values(sku_id=sku_id, redis_id=shard, total=total,
                                                    created_at=utcnow()))
            elif found.total != total:
                raise InvalidOrder(f"SKU {sku_id} already exists with total {found.total}")
        if found is None:
            self.shards[shard].client.hsetnx(stock_key(shard), sku_id, total)
        return shard

    # orders ------------------------------------------------------------------------------

    def place_order(self, order_id: str, member_id: str, items: Any) -> list[ItemResult]:
        """Deduct every line of order `order_id`; return each item's outcome.

        An item ends 'held' (deducted; pay within the delay) or 'rejected' (not enough
        stock). Raises OrderError for bad input or an unknown SKU (nothing changed), and
        StockUnavailable when a shard cannot deduct now: calling again finishes the order.
        """
        _id("order_id", order_id)
        _id("member_id", member_id)
        lines = order_lines(items)
        try:
            pending, generations = self._record(order_id, member_id, lines)
        except IntegrityError:
            # A concurrent copy of this call (a redelivered message) inserted the same rows
            # first: run again to find them, or to refuse a real conflict.
            pending, generations = self._record(order_id, member_id, lines)
        outcomes: list[_Outcome] = []
        try:
            for row in pending:
                outcomes.append(self._deduct(row, generations[row.redis_id]))
            if self.before_settle is not None:
                self.before_settle()
        finally:
            self._settle(outcomes)
        self._check_held(order_id)
        return self._results(order_id)

    def _record(self, order_id: str, member_id: str, lines: list[Line]
                ) -> tuple[list[Any], dict[int, Generation]]:
        """Insert the order and its new items; return the items still 'reserving' and the
        generation of each of their shards."""
        ids = [line[0] for line in lines]
        skus = sorted({line[1] for line in lines})
        now = utcnow()
        with self.sessions.begin() as session:
            session.connection(execution_options=WRITE_INTENT)
            known = set(session.execute(select(SKUS.c.sku_id).where(SKUS.c.sku_id.in_(skus)))
                        .scalars())
            if missing := [sku for sku in skus if sku not in known]:
                raise UnknownSku("UNKNOWN_SKU", ", ".join(missing))
            owner = session.execute(select(ORDERS.c.member_id)
                                    .where(ORDERS.c.order_id == order_id)).scalar()
            if owner is None:
                session.execute(insert(ORDERS).values(order_id=order_id, member_id=member_id,
                                                      created_at=now))
            elif owner != member_id:
                raise InvalidOrder(f"order {order_id} belongs to another member")
            existing = {r.order_item_id: r for r in session.execute(
                select(ORDER_ITEMS).where(ORDER_ITEMS.c.order_item_id.in_(ids)))}
            new = []
            for order_item_id, sku_id, qty in lines:
                row = existing.get(order_item_id)
                if row is None:
                    new.append({"order_item_id": order_item_id, "order_id": order_id,
                                "sku_id": sku_id, "qty": qty,
                                "redis_id": self.router.shard_for(sku_id),
                                "queue": self.router.queue_for(member_id),
                                "state": ItemState.RESERVING, "time_ms": 0,
                                "updated_at": now})
                elif (row.order_id, row.sku_id, row.qty) != (order_id, sku_id, qty):
                    raise DuplicateOrderItem(
                        f"order item {order_item_id} already exists as {row.qty} x "
                        f"{row.sku_id} of order {row.order_id}")
            if new:
                session.execute(insert(ORDER_ITEMS), new)
            pending = list(session.execute(
                select(ORDER_ITEMS, ORDERS.c.member_id)
                .join(ORDERS, ORDERS.c.order_id == ORDER_ITEMS.c.order_id)
                .where(ORDER_ITEMS.c.order_item_id.in_(ids),
                       ORDER_ITEMS.c.state == ItemState.RESERVING)
                .order_by(ORDER_ITEMS.c.order_item_id)))
            generations = {shard: recorded_generation(session, shard)
                           for shard in sorted({row.redis_id for row in pending})}
        return pending, generations

    def _deduct(self, row: Any, generation: Generation) -> _Outcome:
        """The outcome of one reserving item's deduction."""
        scripts = self.shards[row.redis_id]
        try:
            done = scripts.deduct(row.redis_id, row.queue, row.order_item_id, row.sku_id,
                                  row.qty, row.member_id, generation)
        except InsufficientStock as exc:
            return _Outcome(row.order_item_id, ItemState.REJECTED, None, str(exc))
        except NodeMaintaining as exc:
            raise StockUnavailable(f"shard {row.redis_id} is in maintenance: {exc}") from exc
        except NodeStale as exc:
            raise StockUnavailable(f"shard {row.redis_id} is older than the database ({exc}): "
                                   "no deduction until its rebuild") from exc
        except UnknownSku as exc:
            # The database knows the SKU, so the shard lost its stock (restarted empty): the
            # shard's next rebuild restores it.
            raise StockUnavailable(f"shard {row.redis_id} has no stock for {row.sku_id} until "
                                   "its rebuild") from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StockUnavailable(f"shard {row.redis_id} is unreachable: {exc}") from exc
        return _Outcome(row.order_item_id, ItemState.HELD, done.entry, None)

    def _settle(self, outcomes: list[_Outcome]) -> None:
        """Record each outcome; a held item records its entry's time and offset (the shard's
        clock, and the database's side of the shard's generation)."""
        if not outcomes:
            return
        with self.sessions.begin() as session:
            for out in outcomes:
                values: dict[str, Any] = {"state": out.state, "reason": out.reason,
                                          "updated_at": utcnow()}
                if out.entry is not None:
                    values.update(entry=format_entry(out.entry), time_ms=out.entry.time_ms,
                                  redo_offset=out.entry.offset)
                session.execute(
                    update(ORDER_ITEMS)
                    .where(ORDER_ITEMS.c.order_item_id == out.order_item_id,
                           ORDER_ITEMS.c.state == ItemState.RESERVING)
                    .values(**values))

    def _check_held(self, order_id: str) -> None:
        """Check that each held item's shard still holds its deduction (tasks.restock.holds);
        raise StockUnavailable if an item was taken back, so the retry deducts it afresh."""
        try:
            changed = check_holds(self.sessions, self.shards, order_id)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StockUnavailable(f"a shard of order {order_id} is unreachable: {exc}") from exc
        if changed:
            raise StockUnavailable(f"the stock shard lost the deduction of {', '.join(changed)} "
                                   "(restarted or restored before it was recorded): retry")

    def _results(self, order_id: str) -> list[ItemResult]:
        with self.sessions() as session:
            rows = session.execute(select(ORDER_ITEMS).where(ORDER_ITEMS.c.order_id == order_id)
                                   .order_by(ORDER_ITEMS.c.order_item_id)).all()
        return [ItemResult(r.order_item_id, r.sku_id, r.qty, r.state, r.entry, r.reason)
                for r in rows]

    # payments ----------------------------------------------------------------------------

    def pay(self, order_id: str) -> list[ItemResult]:
        """Pay order `order_id` (idempotent): every held item becomes 'paid', in one
        transaction. Raises UnknownOrder, OrderPending, or OrderExpired once any item's
        stock went back (nothing is paid then)."""
        _id("order_id", order_id)
        with self.sessions.begin() as session:
            session.connection(execution_options=WRITE_INTENT)
            states = list(session.execute(
                select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.state)
                .where(ORDER_ITEMS.c.order_id == order_id).with_for_update()))
            if not states:
                raise UnknownOrder(f"no order {order_id}")
            already = session.execute(select(func.count()).select_from(PAYMENTS)
                                      .where(PAYMENTS.c.order_id == order_id)).scalar()
            if not already:
                self._check_payable(order_id, [state for _, state in states])
                session.execute(update(ORDER_ITEMS)
                                .where(ORDER_ITEMS.c.order_id == order_id,
                                       ORDER_ITEMS.c.state == ItemState.HELD)
                                .values(state=ItemState.PAID, updated_at=utcnow()))
                session.execute(insert(PAYMENTS).values(order_id=order_id, paid_at=utcnow()))
        return self._results(order_id)

    @staticmethod
    def _check_payable(order_id: str, states: list[str]) -> None:
        if ItemState.RESERVING in states:
            raise OrderPending(f"order {order_id} still has deductions in flight")
        if any(state in ItemState.RETURNED for state in states):
            raise OrderExpired(f"order {order_id} was not paid in time; its stock went back")
        if ItemState.HELD not in states:
            raise OrderExpired(f"order {order_id} holds no stock to pay for")

    # inspection --------------------------------------------------------------------------

    def inspect(self, sku_id: str) -> SkuView:
        """The SKU's free stock in Redis and its quantities by item state."""
        _id("sku_id", sku_id)
        with self.sessions() as session:
            sku = session.execute(select(SKUS).where(SKUS.c.sku_id == sku_id)).first()
            if sku is None:
                raise UnknownSku("UNKNOWN_SKU", sku_id)
            by_state = {state: int(qty) for state, qty in session.execute(
                select(ORDER_ITEMS.c.state, func.sum(ORDER_ITEMS.c.qty))
                .where(ORDER_ITEMS.c.sku_id == sku_id).group_by(ORDER_ITEMS.c.state))}
        raw = self.shards[sku.redis_id].client.hget(stock_key(sku.redis_id), sku_id)
        return SkuView(sku_id, sku.redis_id, sku.total, None if raw is None else int(raw),
                       by_state)
