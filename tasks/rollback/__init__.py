"""Rollback checkpoints: a task journals how to undo each step; failure runs the undos in reverse.

Inside a task built on `tasks.base.PlatformTask`::

    @compensation("cancel_shipment")
    def cancel_shipment(data: dict[str, Any]) -> None: ...   # idempotent, see below

    @app.task(name="tasks.restock.shop.place_order", base=PlatformTask)
    def place_order(order_id: str) -> None:
        with step("ship", undo="cancel_shipment", data={"order": order_id}):
            ship(order_id)

**Write-ahead.** `step()` journals the step as 'intended' BEFORE its body runs and marks it
'recorded' after; `checkpoint(name, undo=..., data=...)` is the one-line form (a row
'recorded' at once), to be called before the effect too. So every effect that may have run is
in the journal; if `step()` or `checkpoint()` raises (JournalLost above all), the effect has
not run. Compensations must therefore be idempotent and tolerate a step that never happened
or half happened: an 'intended' step is compensated like any other.

**Ownership.** The journal of execution `task_id` is owned by one row of `rollback_owners`:
the owning execution's journal lease token and a state. Every write the owner makes (a new
step, a confirmation, the success) is one transaction that first matches
`owner = :token AND state = 'running'`, so whoever changed that row (the sweeper, a later
delivery) has fenced the old owner out, in the database, whatever Redis said or says:

    owner  open: acquire lease journal:{task_id} (token T); owners row -> running/T
    owner  step/checkpoint: UPDATE owners ... WHERE owner=T AND state='running'; INSERT row
    owner  returns: DELETE owners ... WHERE owner=T AND state='running' + its rows -> SUCCESS
           no row matched: JournalLost, the task FAILS (never SUCCESS)
    sweep  lease gone: UPDATE owners SET state='taken_over' WHERE owner=T AND state='running';
           then compensate the rows that existed, newest first

A paused owner that wakes after a takeover can neither add a step nor succeed. An effect it
had already begun (its intent committed before the takeover) may land after the sweeper ran
its compensation, so the owner, finding its confirmation refused, runs that step's
compensation once more (idempotent) before it raises JournalLost.

What happens to a journal afterwards:

    returns normally                 -> rows deleted (after the fenced success above)
    fails for good, soft time limit  -> rollback(): compensations in reverse seq order
    task_retry                       -> rollback() of the failed attempt (ROLLBACK_ON_RETRY=1),
                                        or handed over to the next attempt (=0, see handover)
    task_revoked(terminate=True)     -> a `tasks.rollback.rollback` task rolls it back
    hard time limit, SIGKILL, pause  -> no signal at all: the sweeper takes over every journal
    past the lease TTL, Redis loss      whose lease is gone, and rolls it back

The journal lease is acquired at the first step with progress=False: the process's lease
keeper renews it for as long as the process lives. Its loss means "the owner may be dead";
the owners row makes that safe to act on even when the owner is alive.

Each step is compensated at most once per journal row: a runner claims a row with
`UPDATE ... SET state='compensating' WHERE id=:id AND state IN ('intended','recorded')`.
Runners go in reverse seq order and stop at the first claim they lose, because whoever won it
is at or past that step and owns the rest; so two runners never compensate steps out of
order. A compensation that keeps failing is retried with COMPENSATION_POLICY, then
dead-lettered (state 'dead'), and the remaining steps still run. A runner that dies
mid-compensation leaves that one row 'compensating' for an operator to look at; the steps
below it stay for the sweeper.

Retention: compensated and dead rows, and closed owners rows, are deleted by the sweeper
JOURNAL_RETENTION seconds after their last change.

A task that records no checkpoint costs nothing: the hooks look at a per-process dict and
return, without any database or Redis I/O.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from celery import Task, current_task
from celery.signals import task_failure, task_prerun, task_retry, task_revoked, worker_ready
from celery.utils.dispatch import Signal
from sqlalchemy import (
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from lease import Lease, LeaseError, Leases, NotAcquired
from lease.keys import lease_key
from tasks.app import app, settings
from tasks.base import PlatformTask
from tasks.db import WRITE_INTENT, affected, utcnow
from tasks.deadletter import DeadLetters
from tasks.keys import HANDOVER_PREFIX, handover_key, journal_lease_name
from tasks.resources import resources_for
from tasks.retry import RetryPolicy, decide
from tasks.validate import text_arg

__all__ = [
    "COMPENSATION_POLICY",
    "HANDOVER_PREFIX",
    "JOURNAL",
    "OWNERS",
    "Journal",
    "JournalBusy",
    "JournalLost",
    "JournalState",
    "NotInTask",
    "OwnerState",
    "RollbackError",
    "RollbackReport",
    "StepOutcome",
    "UnknownCompensation",
    "checkpoint",
    "checkpoint_recorded",
    "compensation",
    "compensations",
    "handover_key",
    "journal",
    "journal_lease_name",
    "rollback",
    "rollback_finished",
    "rollback_now",
    "rollback_on_retry",
    "rollback_started",
    "rollback_step_failed",
    "rollback_step_succeeded",
    "rollback_task",
    "set_journal",
    "settle",
    "step",
    "sweep",
    "sweep_task",
]

log = logging.getLogger("tasks.rollback")

F = TypeVar("F", bound=Callable[[dict[str, Any]], None])

# -- errors ---------------------------------------------------------------------------------


class RollbackError(Exception):
    """Base class of this module's errors."""


class UnknownCompensation(RollbackError, ValueError):
    """`undo` names no registered compensation (so no process could ever run it)."""


class NotInTask(RollbackError, RuntimeError):
    """`checkpoint()` was called outside a running task built on PlatformTask."""


class JournalBusy(RollbackError, RuntimeError):
    """Another live process holds this task's journal lease (a duplicate delivery runs)."""


class JournalLost(RollbackError, RuntimeError):
    """This execution no longer owns its journal: its lease was lost (a pause past the TTL,
    Redis lost the key) and the sweeper or a later delivery may be undoing its steps.

    The task fails with it, whatever it returns: a task is never reported SUCCESS for work
    someone else has undone. A step that raises it did not run its effect.
    """


# -- settings -------------------------------------------------------------------------------


# True: a retried task's failed attempt is rolled back before the retry runs, so every attempt
# starts from a clean slate. False: the journal is handed over to the next attempt and only
# the final outcome decides (rolled back on final failure, deleted on success).
# ROLLBACK_ON_RETRY, read once by the settings.
rollback_on_retry: bool = settings.rollback_on_retry

# Inline retries of a failing compensation: short, because they run inside a task or the
# sweeper; what still fails goes to the dead-letter store.
COMPENSATION_POLICY = RetryPolicy(max_retries=3, initial_interval=0.2, max_interval=1.0,
                                  randomization=0.25)

# rollback-handover:{TASK_ID} -> "1" while a retried task's journal waits for its next attempt
# (ROLLBACK_ON_RETRY=0): the sweeper leaves a handed-over journal alone while this exists.
# TTL: the retry's countdown + VISIBILITY_TIMEOUT + LEASE_TTL (by then the retry message has
# been delivered, or redelivered, if it ever will). Owner: Journal.handover sets it, the next
# attempt's adoption deletes it.


# -- signals (sender: the task name) ------------------------------------------------------------

checkpoint_recorded = Signal(name="checkpoint_recorded", providing_args={
    "task_id", "seq", "name", "compensation", "data"})
rollback_started = Signal(name="rollback_started", providing_args={
    "task_id", "reason", "seqs"})
rollback_step_succeeded = Signal(name="rollback_step_succeeded", providing_args={
    "task_id", "seq", "name", "compensation", "data", "attempts"})
rollback_step_failed = Signal(name="rollback_step_failed", providing_args={
    "task_id", "seq", "name", "compensation", "data", "attempts", "error"})
rollback_finished = Signal(name="rollback_finished", providing_args={
    "task_id", "reason", "report"})

# -- the tables ---------------------------------------------------------------------------------


# A step 'compensating' for longer than this is taken to be stuck under a runner that died
# (left for an operator); a rollback then goes on with the older steps.
STUCK_AFTER = 120.0


class JournalState:
    """The life of a journal row. Only PENDING rows are ever claimed."""

    INTENDED = "intended"  # journaled before its effect: the effect may or may not have run
    RECORDED = "recorded"  # the step happened (or checkpoint() vouched for it)
    COMPENSATING = "compensating"  # claimed by one runner; its compensation is running
    COMPENSATED = "compensated"
    DEAD = "dead"  # the compensation kept failing: see the dead-letter store

    PENDING = (INTENDED, RECORDED)
    FINISHED = (COMPENSATED, DEAD)  # deleted JOURNAL_RETENTION after their last change


class OwnerState:
    """Who owns a journal (one `rollback_owners` row per task id)."""

    RUNNING = "running"  # the execution whose lease token is `owner` may add to it
    HANDED_OVER = "handed_over"  # between two attempts (ROLLBACK_ON_RETRY=0)
    TAKEN_OVER = "taken_over"  # the sweeper fenced the owner out and rolled it back
    ROLLED_BACK = "rolled_back"  # the owner rolled itself back (it failed)

    OPEN = (RUNNING, HANDED_OVER)
    CLOSED = (TAKEN_OVER, ROLLED_BACK)


# Their own MetaData: the tables are created by migrations 0003 and 0007, never by create_all.
_META = MetaData()

JOURNAL = Table(
    "rollback_journal", _META,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task_id", String(255), nullable=False),
    Column("task_name", String(255), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", String(255), nullable=False),
    Column("compensation", String(255), nullable=False),
    Column("data", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("error", Text, nullable=True),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
    UniqueConstraint("task_id", "seq", name="uq_rollback_journal_task_seq"),
)

# The fence of each journal: every write its owner makes matches `owner` and state 'running'
# in the same transaction, so a takeover (a compare-and-set on this row) fences it out.
OWNERS = Table(
    "rollback_owners", _META,
    Column("task_id", String(255), primary_key=True),
    Column("task_name", String(255), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("owner", String(64), nullable=False),  # the owner's journal lease token; '' if none
    Column("state", String(16), nullable=False),
    Column("updated_at", DateTime, nullable=False),
)


# -- compensations ------------------------------------------------------------------------------

_COMPENSATIONS: dict[str, Callable[[dict[str, Any]], None]] = {}


def compensation(name: str) -> Callable[[F], F]:
    """Register `fn(data) -> None` as compensation `name`.

    Registered at import, so every process that imports the module (the task's worker, the
    sweeper's) can run it by name. `fn` MUST be idempotent and must tolerate a step that never
    ran or ran in part: steps are journaled before their effect, and the owner of a step whose
    effect landed after a takeover runs its compensation a second time.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a compensation name must be a non-empty string")

    def register(fn: F) -> F:
        found = _COMPENSATIONS.get(name)
        if found is not None and found is not fn:
            qual = getattr(found, "__qualname__", found)
            raise ValueError(f"compensation {name!r} is already registered ({qual})")
        _COMPENSATIONS[name] = fn
        return fn

    return register


def compensations() -> list[str]:
    """The names of the registered compensations."""
    return sorted(_COMPENSATIONS)


# -- reports ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepOutcome:
    """What one rollback did to one journal row."""

    seq: int
    name: str
    compensation: str
    state: str  # JournalState.COMPENSATED or JournalState.DEAD
    attempts: int
    error: str | None = None


@dataclass(frozen=True)
class RollbackReport:
    """The steps one `rollback()` call compensated (empty: there was nothing left to do).

    `handed_over` is True when another runner had already claimed a step: that runner owns
    the remaining steps and this call stopped there.
    """

    task_id: str
    reason: str
    steps: tuple[StepOutcome, ...] = ()
    handed_over: bool = False

    @property
    def compensated(self) -> list[int]:
        return [s.seq for s in self.steps if s.state == JournalState.COMPENSATED]

    @property
    def dead(self) -> list[int]:
        return [s.seq for s in self.steps if s.state == JournalState.DEAD]


# -- the journal --------------------------------------------------------------------------------


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


def _carries_over(attempt: int) -> bool:
    """With ROLLBACK_ON_RETRY off, a retried task's journal carries its earlier attempts."""
    return not rollback_on_retry and attempt > 0


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


@dataclass
class _Candidate:
    """A journal the sweeper may have to roll back."""

    task_id: str
    owner: str | None  # None: no open owners row (closed, or a journal from before 0007)
    state: str | None
    upto: int = 0  # the newest row id when looked at (for closed journals)


class Journal:
    """The rollback journal on one database (and, to record, one lease manager).

    `leases` is needed only to record checkpoints; a sweeper or a rollback elsewhere needs only
    `sessions`. `sleep` is the seam tests use to skip the compensation retry delays;
    `handover_grace` is how long after a retry's countdown a handed-over journal waits for the
    next attempt before the sweeper rolls it back.
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
        self.policy = policy
        self.sleep = sleep
        self.handover_grace = handover_grace
        self.dead_letters = DeadLetters(sessions)
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
        if undo not in _COMPENSATIONS:
            raise UnknownCompensation(
                f"checkpoint {name!r}: no compensation {undo!r} is registered "
                f"(known: {', '.join(compensations()) or 'none'})")
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
             data: dict[str, Any]) -> Iterator[int]:
        """Journal step `name` as intended, run the block (its effect), then confirm it.

        If the block raises, the row stays 'intended' and the failure's rollback undoes it.
        """
        seq = self.record(task_id, task_name, attempt, name, undo, data, intended=True)
        yield seq
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
            self._compensate_late_effect(task_id, seq)
            raise

    def _compensate_late_effect(self, task_id: str, seq: int) -> None:
        with self.sessions() as session:
            row = session.execute(select(JOURNAL).where(
                JOURNAL.c.task_id == task_id, JOURNAL.c.seq == seq)).first()
        # Still pending: whoever claims it later compensates after the effect, as it should.
        # Dead: the compensation already failed for good and an operator has its letter.
        if row is None or row.state not in (JournalState.COMPENSATING, JournalState.COMPENSATED):
            return
        log.warning("step %s:%d ran after its journal was taken over: compensating it again",
                    task_id, seq)
        attempts, exc = self._run_compensation(task_id, row)
        if exc is not None:
            self.dead_letters.add(
                "compensation", ref=f"{task_id}:{seq}",
                reason=f"compensation {row.compensation!r} of a step that ran after its "
                       f"journal was taken over failed {attempts} time(s): {exc!r}",
                payload={"task_id": task_id, "seq": seq, "name": row.name,
                         "compensation": row.compensation, "data": json.loads(row.data)})

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
            # ROLLBACK_ON_RETRY off, the earlier attempts' rows are ours to carry on).
            leftovers = self._read_steps(task_id, states=JournalState.PENDING)
            if [r for r in leftovers if rollback_on_retry or r.attempt >= attempt]:
                self.rollback(task_id, "leftover of an execution that died",
                              attempt=None if rollback_on_retry else attempt)
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
                    if row.state in OwnerState.CLOSED and _carries_over(attempt):
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
        if not _carries_over(attempt) or self.holds(task_id):
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
            if not (_carries_over(attempt) and self.adopt(task_id, task_name, attempt)):
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

        The marker first, so the sweeper never sees the journal handed over and unguarded.
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
        """Compensate the pending steps of `task_id` in reverse seq order, each at most once.

        `upto_id` limits it to rows with id <= upto_id (the sweeper's snapshot, so a new run
        that started after it is left alone); `attempt` to one attempt's rows.
        """
        steps = self._read_steps(task_id, upto_id=upto_id, attempt=attempt)
        rows = [r for r in steps if r.state in JournalState.PENDING]
        if not rows:
            return RollbackReport(task_id, reason)
        sender = rows[0].task_name
        rollback_started.send(sender=sender, task_id=task_id, reason=reason,
                              seqs=[r.seq for r in rows])
        outcomes: list[StepOutcome] = []
        handed_over = False
        stuck_before = utcnow() - timedelta(seconds=STUCK_AFTER)
        for row in steps:  # newest first, whatever their state
            if row.state == JournalState.COMPENSATING and row.updated_at > stuck_before:
                # Another runner is on this step, so it owns the ones below it too: going
                # on would undo an older step before a newer one.
                handed_over = True
                break
            if row.state not in JournalState.PENDING:
                continue  # done, dead, or stuck under a runner that died (for an operator)
            if not self._claim(row.id):
                handed_over = True
                break
            outcomes.append(self._compensate(task_id, sender, row))
        report = RollbackReport(task_id, reason, tuple(outcomes), handed_over)
        log.info("rollback of %s (%s): compensated %s, dead %s%s", task_id, reason,
                 report.compensated, report.dead, ", handed over" if handed_over else "")
        rollback_finished.send(sender=sender, task_id=task_id, reason=reason, report=report)
        return report

    def _read_steps(self, task_id: str, states: tuple[str, ...] | None = None,
                    upto_id: int | None = None, attempt: int | None = None) -> list[Any]:
        query = select(JOURNAL).where(JOURNAL.c.task_id == task_id).order_by(JOURNAL.c.seq.desc())
        if states is not None:
            query = query.where(JOURNAL.c.state.in_(states))
        if upto_id is not None:
            query = query.where(JOURNAL.c.id <= upto_id)
        if attempt is not None:
            query = query.where(JOURNAL.c.attempt == attempt)
        with self.sessions() as session:
            return list(session.execute(query).all())

    def _claim(self, row_id: int) -> bool:
        with self.sessions.begin() as session:
            return affected(session.execute(
                update(JOURNAL).where(JOURNAL.c.id == row_id,
                                      JOURNAL.c.state.in_(JournalState.PENDING))
                .values(state=JournalState.COMPENSATING, updated_at=utcnow()))) == 1

    def _set_state(self, row_id: int, old: str, new: str, error: str | None = None) -> bool:
        with self.sessions.begin() as session:
            return affected(session.execute(
                update(JOURNAL).where(JOURNAL.c.id == row_id, JOURNAL.c.state == old)
                .values(state=new, error=error, updated_at=utcnow()))) == 1

    def _run_compensation(self, task_id: str, row: Any) -> tuple[int, Exception | None]:
        """Call one row's compensation with COMPENSATION_POLICY retries: (calls, last error)."""
        data = json.loads(row.data)
        attempts = 0
        while True:
            attempts += 1
            try:
                fn = _COMPENSATIONS.get(row.compensation)
                if fn is None:  # this process did not import the module that registers it
                    raise UnknownCompensation(f"no compensation {row.compensation!r} here")
                fn(data)
            except Exception as exc:  # a compensation's failure is recorded, never raised
                delay = decide(self.policy, exc, attempts - 1)
                if delay is None or isinstance(exc, UnknownCompensation):
                    return attempts, exc
                log.info("compensation %s of %s:%d failed (%r); retry in %.2fs",
                         row.compensation, task_id, row.seq, exc, delay)
                self.sleep(delay)
                continue
            return attempts, None

    def _compensate(self, task_id: str, sender: str, row: Any) -> StepOutcome:
        """Run one claimed row's compensation; dead-letter it if it keeps failing."""
        step = {"task_id": task_id, "seq": row.seq, "name": row.name,
                "compensation": row.compensation, "data": json.loads(row.data)}
        attempts, exc = self._run_compensation(task_id, row)
        if exc is not None:
            return self._bury(sender, row, step, attempts, exc)
        self._set_state(row.id, JournalState.COMPENSATING, JournalState.COMPENSATED)
        rollback_step_succeeded.send(sender=sender, attempts=attempts, **step)
        return StepOutcome(row.seq, row.name, row.compensation, JournalState.COMPENSATED,
                           attempts)

    def _bury(self, sender: str, row: Any, step: dict[str, Any], attempts: int,
              exc: Exception) -> StepOutcome:
        error = f"{type(exc).__name__}: {exc}"
        # The letter first: a crash between the two writes leaves a letter for a row still
        # 'compensating', never a 'dead' row without its letter.
        self.dead_letters.add(
            "compensation", ref=f"{step['task_id']}:{row.seq}",
            reason=f"compensation {row.compensation!r} failed {attempts} time(s): {error}",
            payload={**step, "task_name": row.task_name, "attempt": row.attempt,
                     "error": error})
        self._set_state(row.id, JournalState.COMPENSATING, JournalState.DEAD, error=error)
        rollback_step_failed.send(sender=sender, attempts=attempts, error=error, **step)
        return StepOutcome(row.seq, row.name, row.compensation, JournalState.DEAD, attempts,
                           error)

    # -- sweeping -----------------------------------------------------------------------------

    def _candidates(self) -> list[_Candidate]:
        with self.sessions() as session:
            owned = session.execute(
                select(OWNERS.c.task_id, OWNERS.c.owner, OWNERS.c.state)
                .where(OWNERS.c.state.in_(OwnerState.OPEN))).all()
            pending = session.execute(
                select(JOURNAL.c.task_id, func.max(JOURNAL.c.id))
                .where(JOURNAL.c.state.in_(JournalState.PENDING))
                .group_by(JOURNAL.c.task_id)).all()
        found = {t: _Candidate(t, owner, state) for t, owner, state in owned}
        for task_id, upto in pending:
            found.setdefault(task_id, _Candidate(task_id, None, None, int(upto)))
        return list(found.values())

    def orphans(self, redis_client: Any) -> list[_Candidate]:
        """The journals whose owner may be gone: no journal lease, and for a handed-over one
        no handover marker either. Their snapshot is taken before Redis is asked, so rows a
        new owner writes after acquiring the lease are never among them."""
        found = self._candidates()
        if not found:
            return []
        pipe = redis_client.pipeline(transaction=False)
        for c in found:
            pipe.exists(lease_key(journal_lease_name(c.task_id)))
            pipe.exists(handover_key(c.task_id))
        alive = pipe.execute()
        return [c for i, c in enumerate(found)
                if not alive[2 * i]
                and not (c.state == OwnerState.HANDED_OVER and alive[2 * i + 1])]

    def take_over(self, c: _Candidate) -> int | None:
        """Fence out the owner of an orphaned open journal; return the newest row id it wrote
        (the rows to roll back), or None if it changed hands meanwhile."""
        with self.sessions.begin() as session:
            if affected(session.execute(update(OWNERS).where(
                OWNERS.c.task_id == c.task_id, OWNERS.c.owner == c.owner,
                OWNERS.c.state == c.state,
            ).values(state=OwnerState.TAKEN_OVER, updated_at=utcnow()))) != 1:
                return None
            # In the same transaction: the old owner can add no row after this, and a new
            # one cannot take the row before we commit, so these are exactly the old rows.
            upto = session.execute(select(func.max(JOURNAL.c.id))
                                   .where(JOURNAL.c.task_id == c.task_id)).scalar()
        log.warning("took over the journal of %s from its lost owner (%s)", c.task_id, c.state)
        return int(upto or 0)

    def sweep(self, redis_client: Any) -> int:
        """Roll back every journal whose owner is gone; return how many rollbacks ran a step."""
        rolled = 0
        for c in self.orphans(redis_client):
            upto = self.take_over(c) if c.state in OwnerState.OPEN else c.upto
            if not upto:
                continue
            report = self.rollback(c.task_id, "sweeper: the journal's owner is gone",
                                   upto_id=upto)
            rolled += bool(report.steps)
        return rolled

    def prune(self, retention: float) -> tuple[int, int]:
        """Delete finished rows and closed owners rows older than `retention` seconds;
        return (rows, owners) deleted. Rows stuck 'compensating' stay for an operator."""
        cutoff = utcnow() - timedelta(seconds=retention)
        left = select(JOURNAL.c.id).where(JOURNAL.c.task_id == OWNERS.c.task_id).exists()
        with self.sessions.begin() as session:
            rows = affected(session.execute(delete(JOURNAL).where(
                JOURNAL.c.state.in_(JournalState.FINISHED), JOURNAL.c.updated_at < cutoff)))
            owners = affected(session.execute(delete(OWNERS).where(
                OWNERS.c.state.in_(OwnerState.CLOSED), OWNERS.c.updated_at < cutoff, ~left)))
        if rows or owners:
            log.info("journal retention: deleted %d rows and %d owners", rows, owners)
        return rows, owners


# -- the process-wide journal ---------------------------------------------------------------------

_journal: Journal | None = None
_journal_lock = threading.Lock()


def journal() -> Journal:
    """This process's Journal on the platform's database and Redis (created on first use)."""
    global _journal
    with _journal_lock:
        if _journal is None:
            res = resources_for(settings)
            _journal = Journal(res.sessions, res.leases, lease_ttl=settings.lease_ttl,
                               handover_grace=settings.visibility_timeout + settings.lease_ttl)
        return _journal


def set_journal(replacement: Journal | None) -> None:
    """Use `replacement` as this process's journal (tests); None: back to the default."""
    global _journal
    with _journal_lock:
        _journal = replacement


def _forget_after_fork() -> None:
    global _journal, _journal_lock
    # A pool child starts with no open executions and its own connections (resources_for).
    _journal_lock = threading.Lock()
    _journal = None


os.register_at_fork(after_in_child=_forget_after_fork)


def _running() -> tuple[str, str, int]:
    """(task name, task id, attempt) of the running PlatformTask, or NotInTask."""
    task = current_task
    request = getattr(task, "request", None)
    task_id = getattr(request, "id", None)
    if task is None or not task_id:
        raise NotInTask("checkpoint() must be called inside a running Celery task")
    if not isinstance(task._get_current_object(), PlatformTask):
        # Only PlatformTask checks the journal before Celery stores SUCCESS (settle()).
        raise NotInTask(f"checkpoint() needs a task built on tasks.base.PlatformTask, "
                        f"and {task.name} is not")
    return task.name, task_id, int(getattr(request, "retries", 0) or 0)


def checkpoint(name: str, undo: str, data: dict[str, Any]) -> int:
    """Journal step `name` of the running task, undone by compensation `undo` with `data`.

    Write-ahead: call it BEFORE the step's effect; if it raises, do not run the effect.
    Raises UnknownCompensation for an unregistered `undo`, TypeError for data that is not a
    JSON object, NotInTask outside a PlatformTask: all before anything is written;
    JournalLost once the journal is no longer this execution's. Returns the seq.
    """
    task_name, task_id, attempt = _running()
    return journal().record(task_id, task_name, attempt, name, undo, data)


@contextmanager
def step(name: str, undo: str, data: dict[str, Any]) -> Iterator[int]:
    """``with step("ship", undo="cancel_shipment", data={...}): ship()``: the step is
    journaled as intended before the block runs and confirmed after it.

    If entering raises (JournalLost above all), the block has not run. If confirming finds
    the journal taken over, the step's compensation runs again and JournalLost is raised.
    """
    task_name, task_id, attempt = _running()
    with journal().step(task_id, task_name, attempt, name, undo, data) as seq:
        yield seq


def rollback(task_id: str, reason: str) -> RollbackReport:
    """Compensate what execution `task_id` recorded, in reverse order, each step at most once.

    Idempotent: a second call (here or in any process) finds nothing left and runs nothing.
    Closes this process's ownership of the journal afterwards (state 'rolled_back'), if any.
    """
    found = journal()
    try:
        return found.rollback(task_id, reason)
    finally:
        found.close(task_id, final=OwnerState.ROLLED_BACK)


def rollback_now(task_id: str, reason: str) -> RollbackReport:
    """Roll back at once, before Celery records the failure (e.g. on SoftTimeLimitExceeded).

    The later task_failure handler then finds nothing left to do.
    """
    return rollback(task_id, reason)


def settle(task: Task) -> None:
    """`task` returned normally: raise JournalLost if its journal is no longer its own (then it
    fails instead of succeeding), else delete the journal. Called by PlatformTask before
    Celery stores the result; no I/O for a task that has no journal."""
    request = task.request
    task_id = request.id
    current = _journal
    if not task_id or current is None:
        return
    attempt = int(getattr(request, "retries", 0) or 0)
    if current.holds(task_id) or _carries_over(attempt):
        current.settle(task_id, task.name, attempt)


def sweep(sessions: sessionmaker[Session], redis_client: Any,
          policy: RetryPolicy = COMPENSATION_POLICY, retention: float | None = None) -> int:
    """Roll back every journal whose owner is gone; return how many rollbacks ran a step.

    Catches what no signal can: a hard time limit, a SIGKILLed pool process or worker, a pause
    past the lease TTL. With `retention`, also deletes what is older than that (seconds).
    """
    sweeper = Journal(sessions, policy=policy)
    rolled = sweeper.sweep(redis_client)
    if retention is not None:
        sweeper.prune(retention)
    return rolled


# -- Celery tasks -------------------------------------------------------------------------------


@app.task(name="tasks.rollback.sweep", soft_time_limit=240, time_limit=300, acks_late=True)
def sweep_task() -> int:
    """Beat runs this every few seconds; a worker also sends one when it becomes ready."""
    res = resources_for(settings)
    return sweep(res.sessions, res.redis, retention=settings.journal_retention)


@app.task(name="tasks.rollback.rollback", soft_time_limit=240, time_limit=300, acks_late=True)
def rollback_task(task_id: str, reason: str) -> dict[str, Any]:
    """Roll back `task_id` in a pool process (sent when a running task was terminated)."""
    task_id = text_arg("task_id", task_id, max_len=255)
    reason = text_arg("reason", reason, max_len=1000)
    report = journal().rollback(task_id, reason)
    return {"task_id": task_id, "compensated": report.compensated, "dead": report.dead}


# -- triggers -------------------------------------------------------------------------------------


def _request_id(request: Any) -> str | None:
    return getattr(request, "id", None)


def _attempt(request: Any) -> int:
    return int(getattr(request, "retries", 0) or 0)


def _countdown(reason: object) -> float:
    """Seconds until the retry announced by Celery's Retry exception `reason`."""
    when = getattr(reason, "when", None)
    if isinstance(when, datetime):
        now = datetime.now(when.tzinfo) if when.tzinfo else utcnow()
        return max(0.0, (when - now).total_seconds())
    if isinstance(when, int | float):
        return max(0.0, float(when))
    return 0.0


@task_prerun.connect
def _on_prerun(task_id: str | None = None, task: Task | None = None, **_: Any) -> None:
    # ROLLBACK_ON_RETRY off: a retried attempt takes the journal its predecessor handed over
    # before it does anything, so a long first step cannot outlast the handover's grace.
    # One database read per retried attempt; nothing for first attempts.
    if rollback_on_retry or not task_id or not isinstance(task, PlatformTask):
        return
    attempt = _attempt(task.request)
    if attempt > 0:
        journal().adopt(task_id, task.name, attempt)  # errors are logged; settle() retries


@task_failure.connect
def _on_failure(sender: Task | None = None, task_id: str | None = None,
                exception: BaseException | None = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    current = _journal
    if task_id and current is not None and (
            current.holds(task_id) or _carries_over(_attempt(request))):
        rollback(task_id, f"task failed: {exception!r}")


@task_retry.connect
def _on_retry(request: Any = None, reason: object = None, **_: Any) -> None:
    task_id = _request_id(request)
    current = _journal
    if not task_id or current is None or not current.holds(task_id):
        return
    if rollback_on_retry:
        rollback(task_id, f"attempt {_attempt(request)} failed: {reason!r}")
    else:
        current.handover(task_id, _countdown(reason))


@task_revoked.connect
def _on_revoked(request: Any = None, terminated: bool = False, **_: Any) -> None:
    # Runs in the worker's main process, which holds no journal: the killed pool process did.
    # A task revoked before it started recorded nothing in this delivery (what an earlier
    # delivery left is the sweeper's), so only a terminated one needs a rollback; it runs
    # as a task, off the main process's event loop.
    task_id = _request_id(request)
    if terminated and task_id:
        rollback_task.apply_async((task_id, "revoked (terminated)"))


@worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    # A worker that starts may be the replacement of one that was SIGKILLed with journals.
    sweep_task.apply_async(expires=max(settings.lease_ttl, 5.0))
