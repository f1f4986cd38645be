"""A Redis stock shard's maintenance (the design's consistency check): rebuild it from the database.

The rebuild holds the shard's maintenance lease ``{stock:N}:maintenance`` for its whole run;
while that lease exists every stock script of the shard refuses (MAINTAINING), so deductions,
syncs and drains wait and nothing moves under the recount::

    rebuilder  acquire {stock:N}:maintenance           held elsewhere -> BUSY
      0  rebuild-attempts:{stock:N} += 1 (before any work, so a rebuild that kills its
         process counts); past the cap: one dead letter, then DEAD_LETTERED until the
         count's TTL (one maintenance interval) ends or an operator forces a rebuild
      1  DB, one snapshot (REPEATABLE READ; SQLite's read transaction), read in chunks with a
         heartbeat after each: the shard's SKUs (totals), the highest offset an item
         recorded, the paid stock per SKU summed by the database per range of `chunk`
         offsets (GROUP BY: paid history is never loaded row by row, and no statement covers
         more than about `chunk` items, however long a SKU's history), and the items that
         hold stock unpaid (held, and 'reserving' items whose deduction is on record in
         Redis)
      2  DB: term = max(database term, Redis term) + 1, committed first, so a term is never
         handed out twice even if Redis restarted empty
      3  rebuild.lua in chunks (token-checked): term, offset counter >= the database's,
         stock = total - held - paid, and a new redo entry in the new term for every unpaid
         item still holding stock; then DB: each new entry recorded on its item
      4  meta:{stock:N}: next window = shard clock + MAINTENANCE_EVERY; release the lease;
         the attempt count is deleted

A shard is due when its window has passed on its own clock, when it has no schedule (new, or
restarted empty), or when it is stale: its term or offset counter is behind the database's, or
it lacks the stock of a SKU the database assigns it (restored from an older snapshot, a lagging
replica, an empty restart). A stale shard refuses deductions (deduct.lua: STALE) until then.

Entries of older terms meet WRONG_TERM afterwards: the recount already returned (or kept) their
stock, and each unpaid item has its new entry, due at its original time. A rebuild that dies
leaves its lease to expire (the window closes by itself) and the shard still due, so the next
beat tick runs it again; every step above can be repeated. An entry it issued in step 3 but
died before recording still releases its item when drained: the drainer goes by the shard's
term, not by the item's recorded entry (tasks.restock.drain).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from lease import Lease, LeaseLost, NotAcquired
from tasks.deadletters.store import DeadLetters
from tasks.restock.holds import behind_database, recorded_generation
from tasks.restock.keys import (
    deducted_key,
    maintenance_lease_name,
    meta_key,
    offset_key,
    rebuild_attempts_key,
    stock_key,
    term_key,
)
from tasks.restock.redolog import MalformedEntry, format_entry, parse_entry
from tasks.restock.replies import LockNotHeld
from tasks.restock.scripts import Generation, Reissue
from tasks.restock.shards import StockShard
from tasks.restock.tables import ORDER_ITEMS, ORDERS, RESTOCK_NODES, SKUS, ItemState
from tasks.store.db import WRITE_INTENT, utcnow

__all__ = ["MAX_ATTEMPTS", "REBUILD_DEAD_LETTER_KIND", "RebuildOutcome", "RebuildReport",
           "Rebuilder"]

REBUILD_DEAD_LETTER_KIND = "restock-rebuild"
MAX_ATTEMPTS = 3  # rebuilds of a shard started and never finished before it is dead-lettered

log = logging.getLogger("tasks.restock")

T = TypeVar("T")


class RebuildOutcome:
    NOT_DUE = "not-due"
    BUSY = "busy"  # another rebuild of this shard is running
    REBUILT = "rebuilt"
    LOST = "lost"  # the maintenance lease was lost mid-way; the shard stays due
    DEAD_LETTERED = "dead-lettered"  # it kept dying: dead-lettered, not run (see module doc)


@dataclass
class RebuildReport:
    shard: int
    outcome: str
    term: int = 0
    skus: int = 0
    reissued: int = 0
    next_maintain_ms: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.shard, "outcome": self.outcome, "term": self.term,
                "skus": self.skus, "reissued": self.reissued,
                "next_maintain_ms": self.next_maintain_ms}


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


@dataclass
class _Read:
    """What the rebuild read from the database, in one snapshot."""

    generation: Generation  # the database's view of the shard (its max offset is used)
    skus: list[tuple[str, int]]  # (sku_id, total)
    out: dict[str, int]  # sku_id -> units held or paid
    holding: list[Reissue]  # unpaid items still holding stock, to re-issue


class Rebuilder:
    """Rebuilds one shard's stock from the database, in its maintenance window.

    `chunk` bounds every read and every script call (SKUs or items per round trip); the
    holder heartbeats after each, so a rebuild lasts as long as it keeps making progress,
    however large the history. `max_attempts` caps rebuilds that die mid-way (the platform's
    REDELIVERY_CAP). `on_read` is a test seam called after each chunk read.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        shard: StockShard,
        queues: Sequence[str],
        *,
        every_ms: int = 3 * 3600 * 1000,
        lease_ttl: float = 10.0,
        chunk: int = 1000,
        max_attempts: int = MAX_ATTEMPTS,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        if chunk <= 0 or max_attempts <= 0 or every_ms <= 0:
            raise ValueError("chunk, max_attempts and every_ms must be positive")
        self.sessions = sessions
        self.shard = shard
        self.queues = list(queues)
        self.every_ms = every_ms
        self.lease_ttl = lease_ttl
        self.chunk = chunk
        self.max_attempts = max_attempts
        self.on_read = on_read
        self.dead_letters = DeadLetters(sessions)

    def next_window_ms(self) -> int | None:
        """When the shard's next maintenance window opens (shard clock); None if the shard has
        no schedule (new, or restarted empty): it is due at once."""
        raw = self.shard.client.hget(meta_key(self.shard.number), "next_maintain_ms")
        return None if raw is None else int(raw)

    def stale(self) -> bool:
        """True if the shard is behind the database: its term or offset counter is older than
        the database recorded, or it lacks the stock of one of its SKUs."""
        shard = self.shard.number
        with self.sessions() as session:
            known = recorded_generation(session, shard)
            skus = session.execute(select(func.count()).select_from(SKUS)
                                   .where(SKUS.c.redis_id == shard)).scalar() or 0
        with self.shard.client.pipeline(transaction=False) as pipe:
            pipe.get(term_key(shard))
            pipe.get(offset_key(shard))
            pipe.hlen(stock_key(shard))
            term, offset, stocked = pipe.execute()
        return behind_database(term, offset, stocked, known, skus)

    def due(self) -> bool:
        window = self.next_window_ms()
        return window is None or window <= self.shard.now_ms() or self.stale()

    def rebuild(self, force: bool = False) -> RebuildReport:
        """Rebuild the shard if it is due (or `force`: also clears a dead-lettered count)."""
        shard = self.shard.number
        if force:
            self.shard.client.delete(rebuild_attempts_key(shard))
        elif not self.due():
            return RebuildReport(shard, RebuildOutcome.NOT_DUE,
                                 next_maintain_ms=self.next_window_ms() or 0)
        try:
            lease = self.shard.leases.acquire(maintenance_lease_name(shard), ttl=self.lease_ttl)
        except NotAcquired:
            return RebuildReport(shard, RebuildOutcome.BUSY)
        try:
            with lease:
                return self._attempt(lease)
        except (LeaseLost, LockNotHeld):
            log.warning("rebuild of shard %d lost its maintenance lease; it stays due", shard)
            return RebuildReport(shard, RebuildOutcome.LOST)

    def _attempt(self, lease: Lease) -> RebuildReport:
        """Count the attempt before any work (write-ahead: a process that dies keeps it), run
        it, and take the count back unless the process died."""
        shard = self.shard.number
        key = rebuild_attempts_key(shard)
        with self.shard.client.pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.pexpire(key, self.every_ms, nx=True)
            attempts = int(pipe.execute()[0])
        if attempts > self.max_attempts:
            if attempts == self.max_attempts + 1:
                reason = (f"rebuild of shard {shard} started {attempts - 1} times without "
                          f"finishing (REDELIVERY_CAP={self.max_attempts}): it keeps killing "
                          "its worker; force a rebuild once the cause is fixed")
                self.dead_letters.add(REBUILD_DEAD_LETTER_KIND, f"node {shard}", reason,
                                      {"node": shard, "attempts": attempts - 1})
            return RebuildReport(shard, RebuildOutcome.DEAD_LETTERED)
        done = False
        try:
            report = self._rebuild(lease)
            done = True
            return report
        finally:
            if done:
                self.shard.client.delete(key)
            else:
                self.shard.client.decr(key)

    def _rebuild(self, lease: Lease) -> RebuildReport:
        shard = self.shard.number
        read = self._read(lease)
        stock = []
        for sku_id, total in read.skus:
            free = total - read.out[sku_id]
            if free < 0:
                log.error("shard %d SKU %s: %d units held or sold of %d in total", shard,
                          sku_id, read.out[sku_id], total)
            stock.append((sku_id, max(free, 0)))
        generation = Generation(self._next_term(), read.generation.offset)
        lease.check()
        new_entries = []
        scripts = self.shard.scripts
        for part in _chunks(stock, self.chunk):
            scripts.rebuild(shard, self.queues, lease.token, generation, part, [])
            lease.heartbeat()
        for lines in _chunks(read.holding, self.chunk):
            new_entries += scripts.rebuild(shard, self.queues, lease.token, generation, [],
                                           lines)
            lease.heartbeat()
        if not stock and not read.holding:
            scripts.rebuild(shard, self.queues, lease.token, generation, [], [])
        self._promote(new_entries)
        now = self.shard.now_ms()
        next_ms = now + self.every_ms
        self.shard.client.hset(meta_key(shard), mapping={"next_maintain_ms": next_ms,
                                                       "rebuilt_ms": now})
        with self.sessions.begin() as session:
            session.execute(update(RESTOCK_NODES).where(RESTOCK_NODES.c.redis_id == shard)
                            .values(rebuilt_at=utcnow(), next_maintain_at=utcnow()
                                    + timedelta(milliseconds=self.every_ms)))
        log.info("shard %d rebuilt: term %d, %d SKUs, %d items re-issued", shard,
                 generation.term, len(stock), len(read.holding))
        return RebuildReport(shard, RebuildOutcome.REBUILT, generation.term, len(stock),
                             len(read.holding), next_ms)

    def _progress(self, lease: Lease) -> None:
        """After each chunk read: the seam, then proof of progress (or LeaseLost)."""
        if self.on_read is not None:
            self.on_read()
        lease.check()
        lease.heartbeat()

    def _read(self, lease: Lease) -> _Read:
        """Everything the recount needs, from one database snapshot, chunk by chunk."""
        shard = self.shard.number
        with self.sessions() as session:
            if session.get_bind().dialect.name != "sqlite":  # SQLite reads one snapshot
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            generation = recorded_generation(session, shard)
            skus = [(r.sku_id, int(r.total)) for r in session.execute(
                select(SKUS.c.sku_id, SKUS.c.total).where(SKUS.c.redis_id == shard)
                .order_by(SKUS.c.sku_id))]
            out = self._paid(session, lease, generation.offset)
            unpaid = self._unpaid(session, lease)
        holding = self._holding(unpaid)
        for item in holding:
            out[item.sku_id] += item.qty
        holding.sort(key=lambda item: (item.time_ms, item.order_item_id))
        return _Read(generation, skus, out, holding)

    def _paid(self, session: Session, lease: Lease, max_offset: int) -> dict[str, int]:
        """Units paid per SKU of the shard, summed by the database one range of `chunk`
        offsets at a time (index (redis_id, redo_offset); offsets are handed out once per
        shard, so a range holds at most about `chunk` items): every statement is bounded by
        items, however many a SKU has. An item is the shard's by its own redis_id (a change of
        RESTOCK_SHARDS moves every item with its SKU: docs/decisions.md). Paid items
        recorded before offsets existed (migration 0006) have none and are summed in one
        statement, only if there are any."""
        shard = self.shard.number
        paid = (ORDER_ITEMS.c.redis_id == shard, ORDER_ITEMS.c.state == ItemState.PAID)
        out: dict[str, int] = defaultdict(int)

        def add(*where: Any) -> None:
            for sku_id, qty in session.execute(
                    select(ORDER_ITEMS.c.sku_id, func.sum(ORDER_ITEMS.c.qty))
                    .where(*paid, *where).group_by(ORDER_ITEMS.c.sku_id)):
                out[sku_id] += int(qty)
            self._progress(lease)

        for low in range(0, max_offset, self.chunk):
            add(ORDER_ITEMS.c.redo_offset > low, ORDER_ITEMS.c.redo_offset <= low + self.chunk)
        if session.execute(select(ORDER_ITEMS.c.order_item_id)
                           .where(*paid, ORDER_ITEMS.c.redo_offset.is_(None)).limit(1)).first():
            add(ORDER_ITEMS.c.redo_offset.is_(None))
        return out

    def _unpaid(self, session: Session, lease: Lease) -> list[Any]:
        """The shard's 'held' and 'reserving' items, by keyset chunks (a delay's worth)."""
        rows: list[Any] = []
        last = ""
        while True:
            part = list(session.execute(
                select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.sku_id, ORDER_ITEMS.c.qty,
                       ORDER_ITEMS.c.state, ORDER_ITEMS.c.queue, ORDER_ITEMS.c.time_ms,
                       ORDERS.c.member_id)
                .join(ORDERS, ORDERS.c.order_id == ORDER_ITEMS.c.order_id)
                .where(ORDER_ITEMS.c.redis_id == self.shard.number,
                       ORDER_ITEMS.c.state.in_((ItemState.RESERVING, ItemState.HELD)),
                       ORDER_ITEMS.c.order_item_id > last)
                .order_by(ORDER_ITEMS.c.order_item_id).limit(self.chunk)))
            rows += part
            self._progress(lease)
            if len(part) < self.chunk:
                return rows
            last = part[-1].order_item_id

    def _holding(self, unpaid: list[Any]) -> list[Reissue]:
        """The unpaid items that hold stock: every 'held' one, and each 'reserving' one whose
        deduction is on record in Redis (its time is the record's)."""
        reserving = [i.order_item_id for i in unpaid if i.state == ItemState.RESERVING]
        times: dict[str, int] = {}
        for ids in _chunks(reserving, self.chunk):
            records = self.shard.client.hmget(deducted_key(self.shard.number), list(ids))
            for oid, record in zip(ids, records, strict=True):
                if record is not None:
                    times[oid] = _record_time(record)
        return [Reissue(i.queue, i.order_item_id, i.sku_id, i.qty,
                        times.get(i.order_item_id, i.time_ms), i.member_id)
                for i in unpaid
                if i.state == ItemState.HELD or i.order_item_id in times]

    def _next_term(self) -> int:
        shard = self.shard.number
        in_redis = int(self.shard.client.get(term_key(shard)) or 0)
        with self.sessions.begin() as session:
            session.connection(execution_options=WRITE_INTENT)
            stored = session.execute(select(RESTOCK_NODES.c.term)
                                     .where(RESTOCK_NODES.c.redis_id == shard)).scalar()
            term = max(stored or 0, in_redis) + 1
            if stored is None:
                session.execute(insert(RESTOCK_NODES).values(redis_id=shard, term=term))
            else:
                session.execute(update(RESTOCK_NODES).where(RESTOCK_NODES.c.redis_id == shard)
                                .values(term=term))
        return term

    def _promote(self, entries: list[Any]) -> None:
        """Record each re-issued entry (and its offset); a 'reserving' item on record becomes
        'held'."""
        if not entries:
            return
        with self.sessions.begin() as session:
            for entry in entries:
                session.execute(
                    update(ORDER_ITEMS)
                    .where(ORDER_ITEMS.c.order_item_id == entry.order_item_id,
                           ORDER_ITEMS.c.state.in_((ItemState.RESERVING, ItemState.HELD)))
                    .values(state=ItemState.HELD, entry=format_entry(entry),
                            time_ms=entry.time_ms, redo_offset=entry.offset,
                            updated_at=utcnow()))


def _record_time(record: bytes | str) -> int:
    """The time of a deduction on record (0 if the record is not an entry)."""
    try:
        return parse_entry(record).time_ms
    except MalformedEntry:
        return 0
