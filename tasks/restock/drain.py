"""Sync and drain one restock queue: redo log -> delay queue -> stock back.

Timeline of a drain batch, and what each crash point leaves behind::

    drainer  lease {stock:N}:drain:Q (fence f)          held elsewhere -> BUSY, at once
      1  take.lua, one round trip: the shard's term, members with due time <= the shard's
         clock (Redis TIME), raw bytes, and
      2  drain-attempts += 1 for each member of the batch, before any work (write-ahead); a
         member past the cap is dead-lettered instead of run. A member with an earlier
         count was in a batch that never finished: it runs alone, so a poison entry sinks
         only itself
      3  DB, one transaction: the previous batch's SUCCESS items 'released' -> 'restocked';
         this batch's items 'held' -> 'released', but only by entries of that term (restock.lua
         drops an older one as WRONG_TERM; the item's re-issued entry releases it); read which of
         them are paid (one payment lookup; a paid item stays paid)
      4  restock.lua(token, paid flags, entry texts): maintenance and token once, then per
         entry term, offset, stock += qty and ZREM (with its attempt count and record)
         (one round trip)
      5  the batch's SUCCESS items wait for the next batch's step 3 (the last batch's get a
         transaction of their own when the drain stops)

A crash after 3 leaves the entries queued and their items released: the next drainer finds
them unpaid and restocks them. A crash after 4 leaves items 'released' whose stock is back
(released and restocked both count as returned), as does a crash before the next step 3.
restock.lua's offset check makes a repeated entry HAS_BEEN_CONSUMED, so nothing is restocked
twice, whatever was redelivered. A process that dies in a batch (OOM, segfault, SIGKILL)
leaves the batch's attempt counts; an entry that takes `max_attempts` drainers down with it
is dead-lettered (the platform's REDELIVERY_CAP), and nothing retries it forever.

Members are bytes end to end: a member that is not an entry (not UTF-8, wrong fields, another
queue's) is dead-lettered at once and removed exactly as stored. An entry restock.lua cannot
apply (FAILED, e.g. a corrupt stock value; the rest of its batch is applied and recorded) is
retried until its attempts reach the cap, then dead-lettered; so is each entry of a batch the
script refuses whole (an error reply: a key of the wrong type), retried entry by entry. A dead
letter is written to the database before the entry leaves the queue.
Database or Redis outages stop the run and give the batch's attempts back (best effort):
nothing is lost, the next run resumes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import bindparam, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import BindParameter

from lease import LeaseLost, NotAcquired
from tasks.deadletters.store import DeadLetters
from tasks.restock.keys import attempts_key, delay_key, drain_lease_name
from tasks.restock.redolog import MalformedEntry, RedoEntry, parse_entry
from tasks.restock.replies import SUCCESS, Action, LockNotHeld, NodeMaintaining, QueueFull
from tasks.restock.scripts import DEFAULT_CAPACITY, DEFAULT_DELAY_MS, RestockResult, Taken
from tasks.restock.shards import StockShard
from tasks.restock.tables import ORDER_ITEMS, ItemState
from tasks.store.db import WRITE_INTENT, is_transient, utcnow
from tasks.store.validate import quote

__all__ = ["DEAD_LETTER_KIND", "MAX_ATTEMPTS", "DrainOutcome", "DrainReport", "Drainer",
           "SyncReport"]

log = logging.getLogger("tasks.restock")

DEAD_LETTER_KIND = "restock"
MAX_ATTEMPTS = 3  # the seed's "retry three times"; then dead-letter instead of dropping
# A dead letter keeps a member whole up to this many bytes (an entry is far shorter), a prefix
# of anything longer.
LETTER_ENTRY_LIMIT = 1024


# The drain's statements, built once: an expanding bind parameter takes a batch's ids without
# building (and cache-keying) a hundred literals per statement per batch.
_IDS: BindParameter[list[str]] = bindparam("ids", expanding=True)
_RELEASE = (update(ORDER_ITEMS)
            .where(ORDER_ITEMS.c.order_item_id.in_(_IDS),
                   ORDER_ITEMS.c.state.in_((ItemState.RESERVING, ItemState.HELD)))
            .values(state=ItemState.RELEASED, updated_at=bindparam("now")))
_PAID = select(ORDER_ITEMS.c.order_item_id).where(ORDER_ITEMS.c.order_item_id.in_(_IDS),
                                                  ORDER_ITEMS.c.state == ItemState.PAID)
_RESTOCKED = (update(ORDER_ITEMS)
              .where(ORDER_ITEMS.c.order_item_id.in_(_IDS),
                     ORDER_ITEMS.c.state == ItemState.RELEASED)
              .values(state=ItemState.RESTOCKED, updated_at=bindparam("now")))


class DrainOutcome:
    DRAINED = "drained"  # no due entry left
    BUSY = "busy"  # another drainer holds the queue
    SLICE = "slice"  # stopped after its time slice; due entries remain
    MAINTAINING = "maintaining"  # the shard entered maintenance
    LOST = "lost"  # the lease was lost; the next holder goes on
    UNAVAILABLE = "unavailable"  # the database or Redis went away; nothing lost


@dataclass
class DrainReport:
    shard: int
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
        return {"node": self.shard, "queue": self.queue, "outcome": self.outcome,
                "batches": self.batches, "restocked": self.restocked,
                "statuses": dict(self.statuses), "dead_lettered": self.dead_lettered,
                "retried": self.retried}


@dataclass(frozen=True)
class SyncReport:
    shard: int
    queue: str
    moved: int
    refused: str | None  # 'FULL' or 'MAINTAINING': the rest stays in the redo log

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.shard, "queue": self.queue, "moved": self.moved,
                "refused": self.refused}


class _Stop(Exception):
    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class Drainer:
    """Syncs and drains the queues of one shard, on the shard's clock.

    `max_attempts` caps the attempts at one entry, crashes included (the task passes the
    platform's REDELIVERY_CAP). `before_restock` is a test seam run between the payment
    lookup and the restock script (a crash point).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        shard: StockShard,
        *,
        batch: int = 100,
        delay_ms: int = DEFAULT_DELAY_MS,
        capacity: int = DEFAULT_CAPACITY,
        lease_ttl: float = 10.0,
        time_slice: float = 60.0,
        max_attempts: int = MAX_ATTEMPTS,
        before_restock: Callable[[Sequence[RedoEntry]], None] | None = None,
    ) -> None:
        if batch <= 0 or time_slice <= 0 or max_attempts <= 0:
            raise ValueError("batch, time_slice and max_attempts must be positive")
        self.sessions = sessions
        self.shard = shard
        self.batch = batch
        self.delay_ms = delay_ms
        self.capacity = capacity
        self.lease_ttl = lease_ttl
        self.time_slice = time_slice
        self.max_attempts = max_attempts
        self.dead_letters = DeadLetters(sessions)
        self.before_restock = before_restock

    # sync --------------------------------------------------------------------------------

    def sync(self, queue: str, count: int = 1000) -> SyncReport:
        """Move the queue's redo log into its delay queue, `count` entries per script call,
        until the log is drained or the script refuses (FULL, MAINTAINING)."""
        moved, scripts = 0, self.shard.scripts
        try:
            while step := scripts.sync(self.shard.number, queue, count, self.capacity,
                                       self.delay_ms):
                moved += step
        except (QueueFull, NodeMaintaining) as exc:
            return SyncReport(self.shard.number, queue, moved, exc.code)
        return SyncReport(self.shard.number, queue, moved, None)

    # drain -------------------------------------------------------------------------------

    def drain(self, queue: str) -> DrainReport:
        """Restock the queue's due entries in batches under its lease."""
        report = DrainReport(self.shard.number, queue)
        try:
            lease = self.shard.leases.acquire(drain_lease_name(self.shard.number, queue),
                                             ttl=self.lease_ttl)
        except NotAcquired:
            report.outcome = DrainOutcome.BUSY
            return report
        except (redis.ConnectionError, redis.TimeoutError):
            report.outcome = DrainOutcome.UNAVAILABLE
            return report
        started = time.monotonic()
        done: list[str] = []  # restocked items not yet recorded: the next claim records them
        try:
            with lease:
                while True:
                    if time.monotonic() - started > self.time_slice:
                        report.outcome = DrainOutcome.SLICE
                        break
                    lease.check()
                    taken = self.shard.scripts.take(self.shard.number, queue, self.batch)
                    if not taken.members:
                        break
                    self._batch(queue, lease.token, taken, report, done)
                    report.batches += 1
                    lease.heartbeat()
        except _Stop as stop:
            report.outcome = stop.outcome
        except LeaseLost:
            report.outcome = DrainOutcome.LOST
        except (redis.ConnectionError, redis.TimeoutError, DBAPIError) as exc:
            if isinstance(exc, DBAPIError) and not is_transient(exc):
                raise
            log.warning("drain of shard %d queue %s stopped: %s", self.shard.number, queue,
                        exc)
            report.outcome = DrainOutcome.UNAVAILABLE
        self._record_last(done)
        return report

    def _batch(self, queue: str, token: str, taken: Taken, report: DrainReport,
               done: list[str]) -> None:
        """One batch, its attempts already counted (take.lua): restock; give back the attempts
        of members left unprocessed by anything but the death of this process."""
        pending = dict(taken.members)
        try:
            entries: list[tuple[bytes, RedoEntry]] = []
            for member, attempts in taken.members:
                if attempts > self.max_attempts:
                    del pending[member]
                    self._dead_letter(queue, token, member, (
                        f"drained {attempts - 1} times without finishing "
                        f"(REDELIVERY_CAP={self.max_attempts}): the entry keeps killing its "
                        "drainer"), report)
                    continue
                try:
                    entries.append((member, self._parse(queue, member)))
                except MalformedEntry as exc:
                    del pending[member]
                    self._dead_letter(queue, token, member, f"malformed redo entry: {exc}",
                                      report)
            if entries:
                self._restock_entries(queue, token, taken.term, entries, pending, report, done)
        finally:
            self._give_back(queue, pending)

    def _give_back(self, queue: str, pending: dict[bytes, int]) -> None:
        """Undo the attempts of members this batch did not get to (a stop, not a crash)."""
        if not pending:
            return
        key = attempts_key(self.shard.number, queue)
        try:
            with self.shard.client.pipeline(transaction=False) as pipe:
                for member, attempts in pending.items():
                    if attempts <= 1:
                        pipe.hdel(key, member)
                    else:
                        pipe.hincrby(key, member, -1)
                pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("could not give back %d drain attempts on shard %d queue %s: %s",
                        len(pending), self.shard.number, queue, exc)

    def _parse(self, queue: str, member: bytes) -> RedoEntry:
        entry = parse_entry(member)
        if (entry.redis_id, entry.queue) != (self.shard.number, queue):
            raise MalformedEntry(f"entry of shard {entry.redis_id} queue {entry.queue!r} in "
                                 f"shard {self.shard.number} queue {queue!r}")
        return entry

    def _restock_entries(self, queue: str, token: str, term: int,
                         entries: list[tuple[bytes, RedoEntry]], pending: dict[bytes, int],
                         report: DrainReport, done: list[str]) -> None:
        parsed = [entry for _, entry in entries]
        paid = self._claim(parsed, term, done)
        if self.before_restock is not None:
            self.before_restock(parsed)
        batch = [(e, e.order_item_id in paid) for e in parsed]
        counts = {member: pending[member] for member, _ in entries}
        try:
            results = self._restock(queue, token, batch)
        except redis.ResponseError as exc:
            if "NOSCRIPT" in str(exc):
                raise
            log.warning("restock batch on shard %d queue %s failed (%s); entry by entry",
                        self.shard.number, queue, exc)
            results = self._one_by_one(queue, token, entries, batch, pending, report)
        for member, _entry in entries:  # settled with their counts, or failed: no count back
            pending.pop(member, None)
        members = {entry: member for member, entry in entries}
        for result in results:
            if result.action is Action.FAILED:
                member = members[result.entry]
                self._failed_attempt(queue, token, member, counts[member], result.detail,
                                     report)
        self._record(results, report, done)

    def _restock(self, queue: str, token: str, batch: list[tuple[RedoEntry, bool]]
                 ) -> list[RestockResult]:
        try:
            return self.shard.scripts.restock(self.shard.number, queue, token, batch)
        except NodeMaintaining:
            raise _Stop(DrainOutcome.MAINTAINING) from None
        except LockNotHeld:
            raise _Stop(DrainOutcome.LOST) from None

    def _one_by_one(self, queue: str, token: str, entries: list[tuple[bytes, RedoEntry]],
                    batch: list[tuple[RedoEntry, bool]], pending: dict[bytes, int],
                    report: DrainReport) -> list[RestockResult]:
        """After a failed batch call: each entry alone, so one bad entry fails only itself."""
        results = []
        for (member, _), (entry, paid) in zip(entries, batch, strict=True):
            try:
                results += self._restock(queue, token, [(entry, paid)])
                pending.pop(member, None)
            except redis.ResponseError as exc:
                attempts = pending.pop(member)
                self._failed_attempt(queue, token, member, attempts, str(exc), report)
        return results

    def _claim(self, entries: Iterable[RedoEntry], term: int, done: list[str]) -> set[str]:
        """Release the unpaid items of the batch's entries of `term` (read with the batch);
        return the paid ones. An older entry leaves its item alone (step 3): restock.lua's own
        term check, not the item's recorded entry, so it holds whatever a crashed rebuild left
        recorded. The same transaction records `done`, the last batch's restocked items (emptied
        once committed); until then they stay 'released', which counts as returned."""
        ids = sorted({e.order_item_id for e in entries if e.term == term})
        with self.sessions.begin() as session:
            session.connection(execution_options=WRITE_INTENT)
            if done:
                self._mark_restocked(session, done)
            session.execute(_RELEASE, {"ids": ids, "now": utcnow()})
            paid = session.scalars(_PAID, {"ids": ids}).all()
        done.clear()
        return set(paid)

    def _record(self, results: list[RestockResult], report: DrainReport, done: list[str]
                ) -> None:
        """Count the batch's statuses; its restocked items go to `done`, for the next claim."""
        for r in results:
            if r.action is not Action.FAILED:  # counted as retried or dead-lettered
                report.statuses[r.status] += 1
        done.extend({r.entry.order_item_id for r in results if r.status == SUCCESS})

    def _record_last(self, done: list[str]) -> None:
        """Record the last batch's restocked items (best effort: 'released' counts as
        returned, so an outage here loses nothing)."""
        if not done:
            return
        try:
            with self.sessions.begin() as session:
                self._mark_restocked(session, done)
            done.clear()
        except DBAPIError as exc:
            if not is_transient(exc):
                raise
            log.warning("%d restocked items of shard %d left 'released': %s", len(done),
                        self.shard.number, exc)

    @staticmethod
    def _mark_restocked(session: Session, done: list[str]) -> None:
        session.execute(_RESTOCKED, {"ids": sorted(set(done)), "now": utcnow()})

    # failures ----------------------------------------------------------------------------

    def _failed_attempt(self, queue: str, token: str, member: bytes, attempts: int,
                        reason: str, report: DrainReport) -> None:
        """The script failed on `member` at its `attempts`-th attempt (already counted)."""
        if attempts >= self.max_attempts:
            self._dead_letter(queue, token, member,
                              f"restock failed {attempts} times: {reason}", report)
        else:
            report.retried += 1
            log.warning("restock of %s failed (attempt %d of %d): %s", quote(member),
                        attempts, self.max_attempts, reason)

    def _dead_letter(self, queue: str, token: str, member: bytes, reason: str,
                     report: DrainReport) -> None:
        shard = self.shard.number
        score = self.shard.client.zscore(delay_key(shard, queue), member)
        text = member.decode("utf-8", "backslashreplace")
        payload = {"node": shard, "queue": queue, "score": score, "bytes": len(member),
                   "entry": text if len(member) <= LETTER_ENTRY_LIMIT else quote(text)}
        self.dead_letters.add(DEAD_LETTER_KIND, text[:255], reason, payload)
        try:
            self.shard.scripts.discard(shard, queue, token, [member])
        except LockNotHeld:
            raise _Stop(DrainOutcome.LOST) from None
        report.dead_lettered += 1
