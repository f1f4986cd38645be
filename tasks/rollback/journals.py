"""`Journal`: the journals of the executions running in this process, and their ownership.

The journal of execution `task_id` is owned by one row of `rollback_owners`: the owning
execution's journal lease token and a state. Every write the owner makes (a new step, a
confirmation, the success) is one transaction that first matches `owner = :token AND
state = 'running'`, so whoever changed that row (the sweeper, a later delivery) has fenced the
old owner out, in the database, whatever Redis said or says (the package docstring has the
timeline). The journal lease is acquired at the first step with progress=False: the process's
lease keeper renews it for as long as the process lives.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from lease import Lease, LeaseError, Leases, NotAcquired
from lease.keys import lease_key
from tasks.celery import settings
from tasks.rollback.errors import JournalBusy, JournalLost, RollbackError
from tasks.rollback.fences import Fence, Step
from tasks.rollback.keys import handover_key, journal_lease_name
from tasks.rollback.registry import require
from tasks.rollback.runner import (
    COMPENSATION_POLICY,
    Ownership,
    RollbackReport,
    RollbackRunner,
)
from tasks.rollback.settings import rollback_settings
from tasks.rollback.signals import checkpoint_recorded
from tasks.rollback.tables import JOURNAL, OWNERS, JournalState, OwnerState
from tasks.store.db import WRITE_INTENT, affected, utcnow
from tasks.worker.retry import RetryPolicy

__all__ = ["Journal", "carries_over", "rollback_on_retry"]

log = logging.getLogger("tasks.rollback")

# True: a retried task's failed attempt is rolled back before the retry runs, so every attempt
# starts from a clean slate. False: the journal is handed over to the next attempt and only
# the final outcome decides (rolled back on final failure, deleted on success).
# ROLLBACK_ON_RETRY, read once by the settings.
rollback_on_retry: bool = rollback_settings(settings).on_retry

# What a new owner rolls back when it opens a journal a dead execution left behind.
_LEFT = (*JournalState.PENDING, JournalState.COMPENSATING)


def carries_over(attempt: int) -> bool:
    """With ROLLBACK_ON_RETRY off, a retried task's journal carries its earlier attempts."""
    return not rollback_on_retry and attempt > 0


def _json_text(name: str, data: object) -> str:
    """`data` as JSON text, or TypeError: nothing is written for data a sweeper could not read
    back exactly (NaN, tuples, non-string keys, objects)."""
    if not isinstance(data, dict):
        raise TypeError(f"checkpoint {name!r}: data must be a dict, not {type(data).__name__}")
    try:
        text = json.dumps(data, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"checkpoint {name!r}: data is not JSON: {exc}") from None
    if json.loads(text) != data:
        raise TypeError(f"checkpoint {name!r}: data does not survive a JSON round trip "
                        "(tuples or non-string keys?)")
    return text


@dataclass
class _Open:
    """The journal of one execution running in this process (its owner)."""

    task_name: str
    attempt: int
    next_seq: int
    lease: Lease

    @property
    def token(self) -> str:
        return self.lease.token


class Journal:
    """The rollback journal on one database (and, to record, one lease manager).

    `leases` is needed only to record checkpoints; a rollback elsewhere needs only `sessions`.
    `policy` and `sleep` go to the rollback runner (`sleep` is the seam tests use to skip the
    compensation retry delays); `handover_grace` is how long after a retry's countdown a
    handed-over journal waits for the next attempt before the sweeper rolls it back.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        leases: Leases | None = None,
        lease_ttl: float = 10.0,
        policy: RetryPolicy = COMPENSATION_POLICY,
        sleep: Callable[[float], None] = time.sleep,
        handover_grace: float = 60.0,
    ) -> None:
        self.sessions = sessions
        self.leases = leases
        self.lease_ttl = lease_ttl
        self.handover_grace = handover_grace
        self.runner = RollbackRunner(sessions, policy, sleep)
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}

    # -- recording ----------------------------------------------------------------------------

    def record(self, task_id: str, task_name: str, attempt: int, name: str, undo: str,
               data: dict[str, Any], *, intended: bool = False) -> int:
        """Journal step `name` of execution `task_id`, undone by compensation `undo`.

        Validates before any I/O. The first step of an execution takes the journal (its
        lease, then its owners row) and rolls back what a dead earlier run of the same task
        left behind. The row is written only while this execution still owns the journal,
        else JournalLost (and nothing is written). Returns the step's seq.
        """
        require(name, undo)
        if not isinstance(name, str) or not name:
            raise ValueError("a checkpoint name must be a non-empty string")
        text = _json_text(name, data)
        found = self._execution(task_id, task_name, attempt)
        self._check_lease(task_id, found)
        seq = found.next_seq
        now = utcnow()
        with self.sessions.begin() as session:
            self._fence(session, task_id, found, now)
            session.execute(insert(JOURNAL).values(
                task_id=task_id, task_name=task_name, attempt=attempt, seq=seq, name=name,
                compensation=undo, data=text,
                state=JournalState.INTENDED if intended else JournalState.RECORDED,
                error=None, created_at=now, updated_at=now))
        found.next_seq += 1
        checkpoint_recorded.send(sender=task_name, task_id=task_id, seq=seq, name=name,
                                 compensation=undo, data=data)
        return seq

    @contextmanager
    def step(self, task_id: str, task_name: str, attempt: int, name: str, undo: str,
             data: dict[str, Any]) -> Iterator[Step]:
        """Journal step `name` as intended, run the block (its effect, given the step's
        fence: `tasks.rollback.fences`), then confirm it.

        If the block raises, the row stays 'intended' and the failure's rollback undoes it.
        """
        seq = self.record(task_id, task_name, attempt, name, undo, data, intended=True)
        with self._lock:
            lease = self._open[task_id].lease
        yield Step(seq, Fence(lease_key(lease.name), lease.token))
        self.confirm(task_id, seq)

    def confirm(self, task_id: str, seq: int) -> None:
        """Mark step `seq` as done, or raise JournalLost if the journal is no longer ours.

        Then the step's effect may have landed after the sweeper compensated it, so if its
        row was already claimed, its compensation runs once more here (idempotent).
        """
        with self._lock:
            found = self._open.get(task_id)
        try:
            if found is None:
                raise JournalLost(f"task {task_id}: its journal was closed before step {seq} "
                                  "was confirmed")
            self._check_lease(task_id, found)
            now = utcnow()
            with self.sessions.begin() as session:
                self._fence(session, task_id, found, now)
                session.execute(update(JOURNAL).where(
                    JOURNAL.c.task_id == task_id, JOURNAL.c.seq == seq,
                    JOURNAL.c.state == JournalState.INTENDED,
                ).values(state=JournalState.RECORDED, updated_at=now))
        except JournalLost:
            self.runner.compensate_late(task_id, seq)
            raise

    def _check_lease(self, task_id: str, found: _Open) -> None:
        try:
            found.lease.check()  # no I/O: lost, or past safe-until without a renewal
        except LeaseError as exc:
            raise JournalLost(f"task {task_id}: its journal lease was lost ({exc.reason}); "
                              "the sweeper may be undoing its steps") from exc

    @staticmethod
    def _fence(session: Session, task_id: str, found: _Open, now: datetime) -> None:
        """Match this execution's ownership in `session`'s transaction, or raise JournalLost.

        The UPDATE locks the owners row until the transaction ends, so a takeover (an
        UPDATE of the same row) is ordered before or after the whole transaction.
        """
        if affected(session.execute(update(OWNERS).where(
            OWNERS.c.task_id == task_id, OWNERS.c.owner == found.token,
            OWNERS.c.state == OwnerState.RUNNING,
        ).values(updated_at=now))) != 1:
            raise JournalLost(f"task {task_id}: its journal was taken over (the sweeper or "
                              "a later delivery is undoing its steps)")

    # -- ownership ----------------------------------------------------------------------------

    def _execution(self, task_id: str, task_name: str, attempt: int) -> _Open:
        with self._lock:
            found = self._open.get(task_id)
        if found is not None and found.attempt == attempt:
            return found
        if found is not None:  # an earlier attempt ran here and was not closed (eager retry)
            self.close(task_id)
        return self._open_execution(task_id, task_name, attempt)

    def _open_execution(self, task_id: str, task_name: str, attempt: int) -> _Open:
        lease = self._acquire(task_id)
        try:
            previous = self._take(task_id, task_name, attempt, lease.token)
            if previous == OwnerState.HANDED_OVER and self.leases is not None:
                self.leases.client.delete(handover_key(task_id))
            # Rows still pending now belong to no live process: we own the journal (with
            # ROLLBACK_ON_RETRY off, the earlier attempts' rows are ours to carry on). Rows
            # 'compensating' were claimed by a runner our compare-and-set just fenced out.
            leftovers = self.runner.steps(task_id, states=_LEFT)
            if [r for r in leftovers if rollback_on_retry or r.attempt >= attempt]:
                self._undo_leftovers(task_id, attempt, lease.token)
            with self.sessions() as session:
                top = session.execute(select(func.max(JOURNAL.c.seq))
                                      .where(JOURNAL.c.task_id == task_id)).scalar()
        except BaseException:
            self._release(task_id, lease)
            raise
        opened = _Open(task_name, attempt, (top or 0) + 1, lease)
        with self._lock:
            self._open[task_id] = opened
        return opened

    def _undo_leftovers(self, task_id: str, attempt: int, token: str) -> None:
        """Compensate what an earlier execution left before this one runs a step, or raise
        JournalLost: a runner fenced out of it (another owner took the journal meanwhile)
        leaves those steps to that owner, and running the task on top of them would do its
        work twice (nemesis seed 1, nem-saga-310)."""
        report = self.runner.rollback(task_id, "leftover of an execution that died",
                                      attempt=None if rollback_on_retry else attempt,
                                      ownership=Ownership(token, OwnerState.RUNNING),
                                      adopt=True)
        if report.handed_over:
            raise JournalLost(f"task {task_id}: the journal an earlier execution left was "
                              "taken over while this one undid it; it runs nothing")

    def _acquire(self, task_id: str) -> Lease:
        if self.leases is None:
            raise RollbackError("this Journal has no Leases: it cannot record checkpoints")
        try:
            # Blocking: a redelivered task waits out the lease of its SIGKILLed first run
            # (renewed by nobody, it lapses within one TTL). The fence counter is not what
            # fences a journal (the owners row is), so it expires with the lease.
            return self.leases.acquire(journal_lease_name(task_id), ttl=self.lease_ttl,
                                       blocking=True, timeout=2 * self.lease_ttl,
                                       progress=False, fence_ttl=self.lease_ttl)
        except NotAcquired:
            raise JournalBusy(f"task {task_id}: another live process holds its journal "
                              "(a duplicate delivery is running)") from None

    def _take(self, task_id: str, task_name: str, attempt: int, token: str) -> str | None:
        """Make `token` the journal's owner; return the owners row's previous state.

        Only the journal lease's holder calls this, so the only other writer of the row is
        the sweeper: a lost compare-and-set means it just took the journal over; read again.
        """
        for _ in range(3):
            now = utcnow()
            try:
                with self.sessions.begin() as session:
                    session.connection(execution_options=WRITE_INTENT)
                    row = session.execute(select(OWNERS.c.owner, OWNERS.c.state)
                                          .where(OWNERS.c.task_id == task_id)).first()
                    if row is None:
                        session.execute(insert(OWNERS).values(
                            task_id=task_id, task_name=task_name, attempt=attempt,
                            owner=token, state=OwnerState.RUNNING, updated_at=now))
                        return None
                    if row.state in OwnerState.CLOSED and carries_over(attempt):
                        raise JournalLost(
                            f"task {task_id}: the journal of its earlier attempts was rolled "
                            f"back ({row.state}); attempt {attempt} cannot carry it on")
                    if affected(session.execute(update(OWNERS).where(
                        OWNERS.c.task_id == task_id, OWNERS.c.owner == row.owner,
                        OWNERS.c.state == row.state,
                    ).values(owner=token, state=OwnerState.RUNNING, attempt=attempt,
                             task_name=task_name, updated_at=now))) == 1:
                        return str(row.state)
            except IntegrityError:
                continue  # inserted meanwhile: read it again
        raise JournalBusy(f"task {task_id}: its journal kept changing while being opened")

    def adopt(self, task_id: str, task_name: str, attempt: int) -> bool:
        """Take over the journal an earlier attempt handed over (ROLLBACK_ON_RETRY=0), at the
        start of the next attempt; False if there is none. Raises JournalLost if the sweeper
        rolled it back meanwhile."""
        if not carries_over(attempt) or self.holds(task_id):
            return self.holds(task_id)
        with self.sessions() as session:
            exists = session.execute(select(OWNERS.c.state)
                                     .where(OWNERS.c.task_id == task_id)).first()
        if exists is None:
            return False
        self._execution(task_id, task_name, attempt)
        return True

    def holds(self, task_id: str) -> bool:
        """True if an execution of `task_id` in this process owns a journal (no I/O)."""
        return task_id in self._open

    def settle(self, task_id: str, task_name: str, attempt: int) -> None:
        """The task returned normally: delete its journal, or raise JournalLost (the task then
        fails) if it is no longer this execution's. No I/O for a task without a journal."""
        with self._lock:
            found = self._open.get(task_id)
        if found is None:
            if not (carries_over(attempt) and self.adopt(task_id, task_name, attempt)):
                return
            with self._lock:
                found = self._open[task_id]
        self._check_lease(task_id, found)
        with self.sessions.begin() as session:
            if affected(session.execute(delete(OWNERS).where(
                OWNERS.c.task_id == task_id, OWNERS.c.owner == found.token,
                OWNERS.c.state == OwnerState.RUNNING,
            ))) != 1:
                raise JournalLost(f"task {task_id}: its journal was taken over before it "
                                  "could succeed")
            session.execute(delete(JOURNAL).where(JOURNAL.c.task_id == task_id))
        self.close(task_id)

    def handover(self, task_id: str, countdown: float) -> None:
        """A failed attempt is retried with ROLLBACK_ON_RETRY off: give the journal up for the
        next attempt, which may run in another process, and stop keeping its lease alive.

        The marker (`tasks.rollback.keys.handover_key`) first, so the sweeper never sees the journal
        handed over and unguarded.
        """
        with self._lock:
            found = self._open.pop(task_id, None)
        if found is None or self.leases is None:
            return
        try:
            ttl = max(countdown, 0.0) + self.handover_grace
            self.leases.client.set(handover_key(task_id), "1", px=max(1, round(ttl * 1000)))
            with self.sessions.begin() as session:
                session.execute(update(OWNERS).where(
                    OWNERS.c.task_id == task_id, OWNERS.c.owner == found.token,
                    OWNERS.c.state == OwnerState.RUNNING,
                ).values(state=OwnerState.HANDED_OVER, owner="", updated_at=utcnow()))
        finally:
            self._release(task_id, found.lease)

    def close(self, task_id: str, final: str | None = None) -> None:
        """Forget the execution of `task_id` in this process and release its journal lease;
        with `final`, first close its owners row (if still ours) in that state."""
        with self._lock:
            found = self._open.pop(task_id, None)
        if found is None:
            return
        try:
            if final is not None:
                with self.sessions.begin() as session:
                    session.execute(update(OWNERS).where(
                        OWNERS.c.task_id == task_id, OWNERS.c.owner == found.token,
                        OWNERS.c.state == OwnerState.RUNNING,
                    ).values(state=final, updated_at=utcnow()))
        finally:
            self._release(task_id, found.lease)

    @staticmethod
    def _release(task_id: str, lease: Lease) -> None:
        try:
            lease.release()
        except LeaseError as exc:  # lapsed already: nothing left to give up
            log.info("journal lease of %s: %s", task_id, exc)

    # -- rolling back -------------------------------------------------------------------------

    def rollback(self, task_id: str, reason: str, *, upto_id: int | None = None,
                 attempt: int | None = None) -> RollbackReport:
        """Compensate the pending steps of `task_id` newest first, each at most once (see
        `RollbackRunner.rollback`), fenced by this process's ownership if it owns the journal
        (a takeover meanwhile stops it). Leaves that ownership as it is."""
        with self._lock:
            found = self._open.get(task_id)
        ownership = None if found is None else Ownership(found.token, OwnerState.RUNNING)
        return self.runner.rollback(task_id, reason, upto_id=upto_id, attempt=attempt,
                                    ownership=ownership)
