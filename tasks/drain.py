"""Sync and drain one restock queue (seed 002): redo log -> delay queue -> stock back.

Timeline of a drain batch, and what each crash point leaves behind::

    drainer  lease {node:N}:drain:Q (fence f)          held elsewhere -> BUSY, at once
      1  due = ZRANGEBYSCORE delay -inf now LIMIT batch       (nothing changes)
      2  DB, one transaction: items 'held' -> 'released'; read every item's state
         (the payment lookup of the whole batch; a paid item stays paid)
      3  restock.lua(token, batch): per entry maintenance, token, term, offset, then
         stock += qty and ZREM                                 (one round trip)
      4  DB: SUCCESS items 'released' -> 'restocked'

A crash after 2 leaves the entries queued and their items released: the next drainer finds
them unpaid and restocks them. A crash after 3 leaves items 'released' whose stock is back
(released and restocked both count as returned). restock.lua's offset check makes a repeated
entry HAS_BEEN_CONSUMED, so nothing is restocked twice, whatever was redelivered.

An entry that cannot be parsed is dead-lettered at once (no retry can parse it); an entry
whose script call fails (e.g. a corrupt stock value) is retried on the next two drains and
then dead-lettered. A dead letter is written to the database before the entry leaves the
queue. Database or Redis outages stop the run without counting attempts: nothing is lost, the
next run resumes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from lease import LeaseLost, NotAcquired
from tasks.deadletter import DeadLetters
from tasks.models import ORDER_ITEMS, WRITE_INTENT, ItemState, utcnow
from tasks.nodes import StockNode
from tasks.partition import is_transient
from tasks.redolog import MalformedEntry, RedoEntry, format_entry, parse_entry
from tasks.shop import wall_ms
from tasks.stock import (
    DEFAULT_CAPACITY,
    DEFAULT_DELAY_MS,
    SUCCESS,
    LockNotHeld,
    NodeMaintaining,
    QueueFull,
    RestockResult,
    attempts_key,
    delay_key,
    drain_lease_name,
)

__all__ = ["DEAD_LETTER_KIND", "MAX_ATTEMPTS", "DrainOutcome", "DrainReport", "Drainer",
           "SyncReport"]

log = logging.getLogger("tasks.restock")

DEAD_LETTER_KIND = "restock"
MAX_ATTEMPTS = 3  # the seed's "retry three times"; then dead-letter instead of dropping


class DrainOutcome:
    DRAINED = "drained"  # no due entry left
    BUSY = "busy"  # another drainer holds the queue
    SLICE = "slice"  # stopped after its time slice; due entries remain
    MAINTAINING = "maintaining"  # the node entered maintenance
    LOST = "lost"  # the lease was lost; the next holder goes on
    UNAVAILABLE = "unavailable"  # the database or Redis went away; nothing lost


@dataclass
class DrainReport:
    node: int
    queue: str
    outcome: str = DrainOutcome.DRAINED
    batches: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    dead_lettered: int = 0
    retried: int = 0

    @property
    def restocked(self) -> int:
        """Entries whose stock came back in this run."""
        return self.statuses[SUCCESS]

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "queue": self.queue, "outcome": self.outcome,
                "batches": self.batches, "restocked": self.restocked,
                "statuses": dict(self.statuses), "dead_lettered": self.dead_lettered,
                "retried": self.retried}


@dataclass(frozen=True)
class SyncReport:
    node: int
    queue: str
    moved: int
    refused: str | None  # 'FULL' or 'MAINTAINING': the rest stays in the redo log

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "queue": self.queue, "moved": self.moved,
                "refused": self.refused}


class _Stop(Exception):
    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class Drainer:
    """Syncs and drains the queues of one node. `clock_ms` gives wall-clock ms (due times)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        node: StockNode,
        *,
        batch: int = 100,
        delay_ms: int = DEFAULT_DELAY_MS,
        capacity: int = DEFAULT_CAPACITY,
        lease_ttl: float = 10.0,
        time_slice: float = 60.0,
        clock_ms: Callable[[], int] = wall_ms,
        before_restock: Callable[[Sequence[RedoEntry]], None] | None = None,
    ) -> None:
        if batch <= 0 or time_slice <= 0:
            raise ValueError("batch and time_slice must be positive")
        self.sessions = sessions
        self.node = node
        self.batch = batch
        self.delay_ms = delay_ms
        self.capacity = capacity
        self.lease_ttl = lease_ttl
        self.time_slice = time_slice
        self.clock_ms = clock_ms
        self.dead_letters = DeadLetters(sessions)
        # Test seam: runs between the payment lookup and the restock script (crash point).
        self.before_restock = before_restock

    # sync --------------------------------------------------------------------------------

    def sync(self, queue: str, count: int = 1000) -> SyncReport:
        """Move the queue's redo log into its delay queue, `count` entries per script call,
        until the log is drained or the script refuses (FULL, MAINTAINING)."""
        moved, scripts = 0, self.node.scripts
        try:
            while step := scripts.sync(self.node.redis_id, queue, count, self.capacity,
                                       self.delay_ms):
                moved += step
        except (QueueFull, NodeMaintaining) as exc:
            return SyncReport(self.node.redis_id, queue, moved, exc.code)
        return SyncReport(self.node.redis_id, queue, moved, None)

    # drain -------------------------------------------------------------------------------

    def drain(self, queue: str) -> DrainReport:
        """Restock the queue's due entries in batches under its lease."""
        report = DrainReport(self.node.redis_id, queue)
        try:
            lease = self.node.leases.acquire(drain_lease_name(self.node.redis_id, queue),
                                             ttl=self.lease_ttl)
        except NotAcquired:
            report.outcome = DrainOutcome.BUSY
            return report
        except (redis.ConnectionError, redis.TimeoutError):
            report.outcome = DrainOutcome.UNAVAILABLE
            return report
        started = time.monotonic()
        try:
            with lease:
                while True:
                    if time.monotonic() - started > self.time_slice:
                        report.outcome = DrainOutcome.SLICE
                        break
                    lease.check()
                    members = self._due(queue)
                    if not members:
                        break
                    self._batch(queue, lease.token, members, report)
                    report.batches += 1
                    lease.heartbeat()
        except _Stop as stop:
            report.outcome = stop.outcome
        except LeaseLost:
            report.outcome = DrainOutcome.LOST
        except (redis.ConnectionError, redis.TimeoutError, DBAPIError) as exc:
            if isinstance(exc, DBAPIError) and not is_transient(exc):
                raise
            log.warning("drain of node %d queue %s stopped: %s", self.node.redis_id, queue,
                        exc)
            report.outcome = DrainOutcome.UNAVAILABLE
        return report

    def _due(self, queue: str) -> list[str]:
        members = self.node.client.zrangebyscore(
            delay_key(self.node.redis_id, queue), "-inf", self.clock_ms(), start=0,
            num=self.batch)
        return [m.decode("utf-8", "replace") if isinstance(m, bytes) else m for m in members]

    def _batch(self, queue: str, token: str, members: list[str], report: DrainReport) -> None:
        entries: list[RedoEntry] = []
        for member in members:
            try:
                entry = parse_entry(member)
                if (entry.redis_id, entry.queue) != (self.node.redis_id, queue):
                    raise MalformedEntry(f"entry of node {entry.redis_id} queue "
                                         f"{entry.queue!r} in node {self.node.redis_id} queue "
                                         f"{queue!r}")
            except MalformedEntry as exc:
                self._dead_letter(queue, token, member, f"malformed redo entry: {exc}", report)
                continue
            entries.append(entry)
        if not entries:
            return
        paid = self._claim(entries)
        if self.before_restock is not None:
            self.before_restock(entries)
        batch = [(e, e.order_item_id in paid) for e in entries]
        try:
            results = self._restock(queue, token, batch)
        except redis.ResponseError as exc:
            if "NOSCRIPT" in str(exc):
                raise
            log.warning("restock batch on node %d queue %s failed (%s); entry by entry",
                        self.node.redis_id, queue, exc)
            results = self._one_by_one(queue, token, batch, report)
        self._record(results, report)

    def _restock(self, queue: str, token: str, batch: list[tuple[RedoEntry, bool]]
                 ) -> list[RestockResult]:
        try:
            return self.node.scripts.restock(self.node.redis_id, queue, token, batch)
        except NodeMaintaining:
            raise _Stop(DrainOutcome.MAINTAINING) from None
        except LockNotHeld:
            raise _Stop(DrainOutcome.LOST) from None

    def _one_by_one(self, queue: str, token: str, batch: list[tuple[RedoEntry, bool]],
                    report: DrainReport) -> list[RestockResult]:
        """After a failed batch call: each entry alone, so one bad entry fails only itself."""
        results = []
        for entry, paid in batch:
            try:
                results += self._restock(queue, token, [(entry, paid)])
            except redis.ResponseError as exc:
                self._failed_attempt(queue, token, format_entry(entry), str(exc), report)
        return results

    def _claim(self, entries: list[RedoEntry]) -> set[str]:
        """Release the batch's unpaid items in the database; return the paid ones."""
        ids = sorted({e.order_item_id for e in entries})
        with self.sessions.begin() as session:
            session.connection(execution_options=WRITE_INTENT)
            session.execute(update(ORDER_ITEMS)
                            .where(ORDER_ITEMS.c.order_item_id.in_(ids),
                                   ORDER_ITEMS.c.state.in_((ItemState.RESERVING,
                                                            ItemState.HELD)))
                            .values(state=ItemState.RELEASED, updated_at=utcnow()))
            rows = session.execute(select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.state)
                                   .where(ORDER_ITEMS.c.order_item_id.in_(ids)))
            return {row.order_item_id for row in rows if row.state == ItemState.PAID}

    def _record(self, results: list[RestockResult], report: DrainReport) -> None:
        done = sorted({r.entry.order_item_id for r in results if r.status == SUCCESS})
        for r in results:
            report.statuses[r.status] += 1
        if done:
            with self.sessions.begin() as session:
                session.execute(update(ORDER_ITEMS)
                                .where(ORDER_ITEMS.c.order_item_id.in_(done),
                                       ORDER_ITEMS.c.state == ItemState.RELEASED)
                                .values(state=ItemState.RESTOCKED, updated_at=utcnow()))

    # failures ----------------------------------------------------------------------------

    def _failed_attempt(self, queue: str, token: str, member: str, reason: str,
                        report: DrainReport) -> None:
        attempts = int(self.node.client.hincrby(attempts_key(self.node.redis_id, queue),
                                                member, 1))
        if attempts >= MAX_ATTEMPTS:
            self._dead_letter(queue, token, member,
                              f"restock failed {attempts} times: {reason}", report)
        else:
            report.retried += 1
            log.warning("restock of %s failed (attempt %d of %d): %s", member, attempts,
                        MAX_ATTEMPTS, reason)

    def _dead_letter(self, queue: str, token: str, member: str, reason: str,
                     report: DrainReport) -> None:
        node = self.node.redis_id
        score = self.node.client.zscore(delay_key(node, queue), member)
        self.dead_letters.add(DEAD_LETTER_KIND, member, reason,
                              {"node": node, "queue": queue, "entry": member, "score": score})
        try:
            self.node.scripts.discard(node, queue, token, [member])
        except LockNotHeld:
            raise _Stop(DrainOutcome.LOST) from None
        report.dead_lettered += 1
