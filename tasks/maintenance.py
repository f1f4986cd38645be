"""A Redis stock node's maintenance (seed 002's consistency check): rebuild it from the database.

The rebuild holds the node's maintenance lease ``{node:N}:maintenance`` for its whole run;
while that lease exists every stock script of the node refuses (MAINTAINING), so deductions,
syncs and drains wait and nothing moves under the recount::

    rebuilder  acquire {node:N}:maintenance           held elsewhere -> BUSY
      1  DB: the node's SKUs (totals) and its items that hold stock (held, paid, and
         'reserving' items whose deduction is on record in Redis)
      2  DB: term = max(database term, Redis term) + 1, committed first, so a term is never
         handed out twice even if Redis restarted empty
      3  rebuild.lua in chunks (token-checked): term, stock = total - held - paid, and a new
         redo entry in the new term for every unpaid item still holding stock
      4  meta:{node:N}: next window = now + MAINTENANCE_EVERY; release the lease

Entries of older terms meet WRONG_TERM afterwards: the recount already returned (or kept) their
stock, and each unpaid item has its new entry, due at its original time. A rebuild that dies
leaves its lease to expire (the window closes by itself) and the node still due, so the next
beat tick runs it again; every step above can be repeated.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from lease import LeaseLost, NotAcquired
from tasks.models import (
    ORDER_ITEMS,
    ORDERS,
    RESTOCK_NODES,
    SKUS,
    WRITE_INTENT,
    ItemState,
    utcnow,
)
from tasks.nodes import StockNode
from tasks.redolog import format_entry
from tasks.shop import wall_ms
from tasks.stock import (
    LockNotHeld,
    Reissue,
    deducted_key,
    maintenance_lease_name,
    meta_key,
    term_key,
)

__all__ = ["RebuildOutcome", "RebuildReport", "Rebuilder"]

log = logging.getLogger("tasks.restock")

T = TypeVar("T")


class RebuildOutcome:
    NOT_DUE = "not-due"
    BUSY = "busy"  # another rebuild of this node is running
    REBUILT = "rebuilt"
    LOST = "lost"  # the maintenance lease was lost mid-way; the node stays due


@dataclass
class RebuildReport:
    node: int
    outcome: str
    term: int = 0
    skus: int = 0
    reissued: int = 0
    next_maintain_ms: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "outcome": self.outcome, "term": self.term,
                "skus": self.skus, "reissued": self.reissued,
                "next_maintain_ms": self.next_maintain_ms}


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class Rebuilder:
    """Rebuilds one node's stock from the database, in its maintenance window."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        node: StockNode,
        queues: Sequence[str],
        *,
        every_ms: int = 3 * 3600 * 1000,
        lease_ttl: float = 10.0,
        chunk: int = 1000,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.sessions = sessions
        self.node = node
        self.queues = list(queues)
        self.every_ms = every_ms
        self.lease_ttl = lease_ttl
        self.chunk = chunk
        self.clock_ms = clock_ms

    def next_window_ms(self) -> int | None:
        """When the node's next maintenance window opens; None if the node has no schedule
        (new, or restarted empty): it is due at once."""
        raw = self.node.client.hget(meta_key(self.node.redis_id), "next_maintain_ms")
        return None if raw is None else int(raw)

    def due(self) -> bool:
        window = self.next_window_ms()
        return window is None or window <= self.clock_ms()

    def rebuild(self, force: bool = False) -> RebuildReport:
        """Rebuild the node if its window is due (or `force`)."""
        node = self.node.redis_id
        if not force and not self.due():
            return RebuildReport(node, RebuildOutcome.NOT_DUE,
                                 next_maintain_ms=self.next_window_ms() or 0)
        try:
            lease = self.node.leases.acquire(maintenance_lease_name(node), ttl=self.lease_ttl)
        except NotAcquired:
            return RebuildReport(node, RebuildOutcome.BUSY)
        try:
            with lease:
                return self._rebuild(lease)
        except (LeaseLost, LockNotHeld):
            log.warning("rebuild of node %d lost its maintenance lease; it stays due", node)
            return RebuildReport(node, RebuildOutcome.LOST)

    def _rebuild(self, lease: Any) -> RebuildReport:
        node = self.node.redis_id
        skus, items = self._read()
        on_record = self._on_record([i for i in items if i.state == ItemState.RESERVING])
        holding = [i for i in items if i.state != ItemState.RESERVING
                   or i.order_item_id in on_record]
        out: dict[str, int] = defaultdict(int)
        for item in holding:
            out[item.sku_id] += item.qty
        stock = []
        for sku_id, total in skus:
            free = total - out[sku_id]
            if free < 0:
                log.error("node %d SKU %s: %d units held or sold of %d in total", node,
                          sku_id, out[sku_id], total)
            stock.append((sku_id, max(free, 0)))
        reissue = [Reissue(i.queue, i.order_item_id, i.sku_id, i.qty, i.time_ms, i.member_id)
                   for i in holding if i.state != ItemState.PAID]
        term = self._next_term()
        lease.check()
        new_entries = []
        scripts = self.node.scripts
        for part in _chunks(stock, self.chunk):
            scripts.rebuild(node, self.queues, lease.token, term, part, [])
            lease.heartbeat()
        for lines in _chunks(reissue, self.chunk):
            new_entries += scripts.rebuild(node, self.queues, lease.token, term, [], lines)
            lease.heartbeat()
        if not stock and not reissue:
            scripts.rebuild(node, self.queues, lease.token, term, [], [])
        self._promote(new_entries)
        now = self.clock_ms()
        next_ms = now + self.every_ms
        self.node.client.hset(meta_key(node), mapping={"next_maintain_ms": next_ms,
                                                       "rebuilt_ms": now})
        with self.sessions.begin() as session:
            session.execute(update(RESTOCK_NODES).where(RESTOCK_NODES.c.redis_id == node)
                            .values(rebuilt_at=utcnow(), next_maintain_at=utcnow()
                                    + timedelta(milliseconds=self.every_ms)))
        log.info("node %d rebuilt: term %d, %d SKUs, %d items re-issued", node, term,
                 len(stock), len(reissue))
        return RebuildReport(node, RebuildOutcome.REBUILT, term, len(stock), len(reissue),
                             next_ms)

    def _read(self) -> tuple[list[tuple[str, int]], list[Any]]:
        node = self.node.redis_id
        with self.sessions() as session:
            skus = [(r.sku_id, int(r.total)) for r in session.execute(
                select(SKUS.c.sku_id, SKUS.c.total).where(SKUS.c.redis_id == node)
                .order_by(SKUS.c.sku_id))]
            items = list(session.execute(
                select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.sku_id, ORDER_ITEMS.c.qty,
                       ORDER_ITEMS.c.state, ORDER_ITEMS.c.queue, ORDER_ITEMS.c.time_ms,
                       ORDERS.c.member_id)
                .join(ORDERS, ORDERS.c.order_id == ORDER_ITEMS.c.order_id)
                .where(ORDER_ITEMS.c.redis_id == node,
                       ORDER_ITEMS.c.state.in_((ItemState.RESERVING, *ItemState.OUT)))
                .order_by(ORDER_ITEMS.c.time_ms, ORDER_ITEMS.c.order_item_id)))
        return skus, items

    def _on_record(self, reserving: list[Any]) -> set[str]:
        """The 'reserving' items whose deduction did happen in Redis."""
        if not reserving:
            return set()
        ids = [i.order_item_id for i in reserving]
        records = self.node.client.hmget(deducted_key(self.node.redis_id), ids)
        return {oid for oid, record in zip(ids, records, strict=True) if record is not None}

    def _next_term(self) -> int:
        node = self.node.redis_id
        in_redis = int(self.node.client.get(term_key(node)) or 0)
        with self.sessions.begin() as session:
            session.connection(execution_options=WRITE_INTENT)
            stored = session.execute(select(RESTOCK_NODES.c.term)
                                     .where(RESTOCK_NODES.c.redis_id == node)).scalar()
            term = max(stored or 0, in_redis) + 1
            if stored is None:
                session.execute(insert(RESTOCK_NODES).values(redis_id=node, term=term))
            else:
                session.execute(update(RESTOCK_NODES).where(RESTOCK_NODES.c.redis_id == node)
                                .values(term=term))
        return term

    def _promote(self, entries: list[Any]) -> None:
        """Record each re-issued entry; a 'reserving' item on record becomes 'held'."""
        if not entries:
            return
        with self.sessions.begin() as session:
            for entry in entries:
                session.execute(
                    update(ORDER_ITEMS)
                    .where(ORDER_ITEMS.c.order_item_id == entry.order_item_id,
                           ORDER_ITEMS.c.state.in_((ItemState.RESERVING, ItemState.HELD)))
                    .values(state=ItemState.HELD, entry=format_entry(entry),
                            updated_at=utcnow()))
