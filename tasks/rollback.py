"""Rollback checkpoints: a task journals how to undo each step; failure runs the undos in reverse.

Inside a task::

    @compensation("release_stock")
    def release_stock(data: dict[str, Any]) -> None: ...

    @app.task(name="tasks.shop.place_order")
    def place_order(order_id: str) -> None:
        reserve(order_id)
        checkpoint("reserve_stock", undo="release_stock", data={"order": order_id})
        ...

A checkpoint is a row of the durable journal `rollback_journal` (state 'recorded'). What happens
to the rows afterwards:

    task_success                     -> rows deleted, no compensation runs
    task_failure (failed for good)   -> rollback(): compensations in reverse seq order
    task_retry                       -> rollback() of the failed attempt (ROLLBACK_ON_RETRY=1)
    task_revoked(terminate=True)     -> a `tasks.rollback.rollback` task rolls it back
    hard time limit, SIGKILL         -> no signal at all: the sweeper rolls back every task whose
                                        rows are 'recorded' and whose journal lease is gone

The journal lease `journal:{task_id}` is acquired at the first checkpoint with progress=False:
the process's lease keeper renews it for as long as the process lives, whatever the task does,
so "lease gone" means "the process that wrote the journal is dead" (or Redis lost the key, in
which case the rollback comes early but still once).

Each step is compensated at most once across all processes: a runner claims a row with
`UPDATE ... SET state='compensating' WHERE id=:id AND state='recorded'` and runs the
compensation only if that matched a row. Runners go in reverse seq order and stop at the first
claim they lose, because whoever won it is at or past that step and owns the rest; so two
runners never compensate steps out of order. A compensation that keeps failing is retried with
COMPENSATION_POLICY, then dead-lettered (state 'dead'), and the remaining steps still run. A
runner that dies mid-compensation leaves that one row 'compensating' for an operator to look
at (running it again could undo twice); the steps below it stay 'recorded' for the sweeper.

A task that records no checkpoint costs nothing: the signal handlers look at a per-process dict
and return, without any database or Redis I/O.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from celery import Task, current_task
from celery.signals import task_failure, task_retry, task_revoked, task_success, worker_ready
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
from sqlalchemy.orm import Session, sessionmaker

from lease import Lease, LeaseError, Leases, NotAcquired
from lease.keys import lease_key
from tasks.app import app, settings
from tasks.deadletter import DeadLetters
from tasks.models import affected, utcnow
from tasks.resources import resources_for
from tasks.retry import RetryPolicy, decide
from tasks.settings import SettingsError

__all__ = [
    "COMPENSATION_POLICY",
    "JOURNAL",
    "Journal",
    "JournalBusy",
    "JournalState",
    "NotInTask",
    "RollbackError",
    "RollbackReport",
    "StepOutcome",
    "UnknownCompensation",
    "checkpoint",
    "checkpoint_recorded",
    "compensation",
    "compensations",
    "discard",
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
    """`checkpoint()` was called outside a running Celery task."""


class JournalBusy(RollbackError, RuntimeError):
    """Another live process holds this task's journal lease (a duplicate delivery runs)."""


# -- settings -------------------------------------------------------------------------------


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} must be one of 1/true/yes/on or 0/false/no/off")


# True: a retried task's failed attempt is rolled back before the retry runs, so every attempt
# starts from a clean slate. False: the journal carries over to the next attempt and only the
# final outcome decides (rolled back on final failure, discarded on success).
rollback_on_retry: bool = _env_flag("ROLLBACK_ON_RETRY", True)

# Inline retries of a failing compensation: short, because they run inside a task or the
# sweeper; what still fails goes to the dead-letter store.
COMPENSATION_POLICY = RetryPolicy(max_retries=3, initial_interval=0.2, max_interval=1.0,
                                  randomization=0.25)

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

# -- the journal table ------------------------------------------------------------------------


# A step 'compensating' for longer than this is taken to be stuck under a runner that died
# (left for an operator); a rollback then goes on with the older steps.
STUCK_AFTER = 120.0


class JournalState:
    """The life of a journal row. Only RECORDED rows are ever claimed."""

    RECORDED = "recorded"  # the step happened; its compensation has not run
    COMPENSATING = "compensating"  # claimed by one runner; its compensation is running
    COMPENSATED = "compensated"
    DEAD = "dead"  # the compensation kept failing: see the dead-letter store


# Its own MetaData: the table is created by migration 0003, never by create_all.
JOURNAL = Table(
    "rollback_journal", MetaData(),
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


def journal_lease_name(task_id: str) -> str:
    """The lease that marks the journal of `task_id` as owned by a live process."""
    return f"journal:{task_id}"


# -- compensations ------------------------------------------------------------------------------

_COMPENSATIONS: dict[str, Callable[[dict[str, Any]], None]] = {}


def compensation(name: str) -> Callable[[F], F]:
    """Register `fn(data) -> None` as compensation `name`.

    Registered at import, so every process that imports the module (the task's worker, the
    sweeper's) can run it by name. `fn` must be idempotent in effect where it can: it runs at
    most once per journal row, but a row can be recorded for a step whose effect was partial.
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


@dataclass
class _Open:
    """The journal of one execution running in this process."""

    task_name: str
    attempt: int
    next_seq: int
    lease: Lease | None


class Journal:
    """The rollback journal on one database (and, to record, one lease manager).

    `leases` is needed only to record checkpoints; a sweeper or a rollback elsewhere needs only
    `sessions`. `sleep` is the seam tests use to skip the compensation retry delays.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        leases: Leases | None = None,
        lease_ttl: float = 10.0,
        policy: RetryPolicy = COMPENSATION_POLICY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.sessions = sessions
        self.leases = leases
        self.lease_ttl = lease_ttl
        self.policy = policy
        self.sleep = sleep
        self.dead_letters = DeadLetters(sessions)
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}

    # -- recording ----------------------------------------------------------------------------

    def record(self, task_id: str, task_name: str, attempt: int, name: str, undo: str,
               data: dict[str, Any]) -> int:
        """Journal step `name` of execution `task_id`, undone by compensation `undo`.

        Validates before any I/O. The first checkpoint of an execution takes the journal
        lease (waiting out a dead duplicate's lease) and rolls back what a dead earlier run of
        the same task left behind. Returns the step's seq.
        """
        if undo not in _COMPENSATIONS:
            raise UnknownCompensation(
                f"checkpoint {name!r}: no compensation {undo!r} is registered "
                f"(known: {', '.join(compensations()) or 'none'})")
        if not isinstance(name, str) or not name:
            raise ValueError("a checkpoint name must be a non-empty string")
        text = _json_text(name, data)
        with self._lock:
            found = self._open.get(task_id)
        if found is None or found.attempt != attempt:
            found = self._open_execution(task_id, task_name, attempt, found)
        if found.lease is not None:
            found.lease.check()  # a lost journal lease: the sweeper may already undo us
        seq = found.next_seq
        found.next_seq += 1
        now = utcnow()
        with self.sessions.begin() as session:
            session.execute(insert(JOURNAL).values(
                task_id=task_id, task_name=task_name, attempt=attempt, seq=seq, name=name,
                compensation=undo, data=text, state=JournalState.RECORDED, error=None,
                created_at=now, updated_at=now))
        checkpoint_recorded.send(sender=task_name, task_id=task_id, seq=seq, name=name,
                                 compensation=undo, data=data)
        return seq

    def _open_execution(self, task_id: str, task_name: str, attempt: int,
                        previous: _Open | None) -> _Open:
        lease = previous.lease if previous is not None else self._acquire(task_id, attempt)
        # Rows still 'recorded' now belong to no live process: we hold the lease (or, with
        # ROLLBACK_ON_RETRY off, the earlier attempt's process holds it for us).
        leftovers = self._read_steps(task_id, state=JournalState.RECORDED)
        stale = [r for r in leftovers if rollback_on_retry or r.attempt >= attempt]
        if stale:
            self.rollback(task_id, "leftover of an execution that died",
                          attempt=None if rollback_on_retry else attempt)
        with self.sessions() as session:
            top = session.execute(
                select(func.max(JOURNAL.c.seq)).where(JOURNAL.c.task_id == task_id)).scalar()
        opened = _Open(task_name, attempt, (top or 0) + 1, lease)
        with self._lock:
            self._open[task_id] = opened
        return opened

    def _acquire(self, task_id: str, attempt: int) -> Lease | None:
        if self.leases is None:
            raise RollbackError("this Journal has no Leases: it cannot record checkpoints")
        try:
            # Blocking: a redelivered task waits out the lease of its SIGKILLed first run
            # (renewed by nobody, it lapses within one TTL).
            return self.leases.acquire(journal_lease_name(task_id), ttl=self.lease_ttl,
                                       blocking=True, timeout=2 * self.lease_ttl,
                                       progress=False)
        except NotAcquired:
            if not rollback_on_retry and attempt > 0:
                # The earlier attempt's process still holds the lease and thereby keeps the
                # sweeper off the journal this attempt carries on.
                return None
            raise JournalBusy(f"task {task_id}: another live process holds its journal "
                              "(a duplicate delivery is running)") from None

    def holds(self, task_id: str) -> bool:
        """True if an execution of `task_id` in this process recorded a checkpoint (no I/O)."""
        return task_id in self._open

    def close(self, task_id: str) -> None:
        """Forget the execution of `task_id` in this process and release its journal lease."""
        with self._lock:
            found = self._open.pop(task_id, None)
        if found is not None and found.lease is not None:
            try:
                found.lease.release()
            except LeaseError as exc:  # lapsed already: nothing left to give up
                log.info("journal lease of %s: %s", task_id, exc)

    # -- outcomes -----------------------------------------------------------------------------

    def discard(self, task_id: str) -> int:
        """The task succeeded: delete its journal (no compensation runs); return rows deleted."""
        with self.sessions.begin() as session:
            deleted = affected(session.execute(
                delete(JOURNAL).where(JOURNAL.c.task_id == task_id)))
        self.close(task_id)
        return deleted

    def rollback(self, task_id: str, reason: str, *, upto_id: int | None = None,
                 attempt: int | None = None) -> RollbackReport:
        """Compensate the 'recorded' steps of `task_id` in reverse seq order, each at most once.

        `upto_id` limits it to rows with id <= upto_id (the sweeper's snapshot, so a new run
        that started after it is left alone); `attempt` to one attempt's rows.
        """
        steps = self._read_steps(task_id, upto_id=upto_id, attempt=attempt)
        rows = [r for r in steps if r.state == JournalState.RECORDED]
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
            if row.state != JournalState.RECORDED:
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

    def _read_steps(self, task_id: str, state: str | None = None, upto_id: int | None = None,
                    attempt: int | None = None) -> list[Any]:
        query = select(JOURNAL).where(JOURNAL.c.task_id == task_id).order_by(JOURNAL.c.seq.desc())
        if state is not None:
            query = query.where(JOURNAL.c.state == state)
        if upto_id is not None:
            query = query.where(JOURNAL.c.id <= upto_id)
        if attempt is not None:
            query = query.where(JOURNAL.c.attempt == attempt)
        with self.sessions() as session:
            return list(session.execute(query).all())

    def _claim(self, row_id: int) -> bool:
        return self._set_state(row_id, JournalState.RECORDED, JournalState.COMPENSATING)

    def _set_state(self, row_id: int, old: str, new: str, error: str | None = None) -> bool:
        with self.sessions.begin() as session:
            return affected(session.execute(
                update(JOURNAL).where(JOURNAL.c.id == row_id, JOURNAL.c.state == old)
                .values(state=new, error=error, updated_at=utcnow()))) == 1

    def _compensate(self, task_id: str, sender: str, row: Any) -> StepOutcome:
        """Run one claimed row's compensation with retries; dead-letter it if it keeps failing."""
        data = json.loads(row.data)
        step = {"task_id": task_id, "seq": row.seq, "name": row.name,
                "compensation": row.compensation, "data": data}
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
                if delay is not None and not isinstance(exc, UnknownCompensation):
                    log.info("compensation %s of %s:%d failed (%r); retry in %.2fs",
                             row.compensation, task_id, row.seq, exc, delay)
                    self.sleep(delay)
                    continue
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

    def orphans(self, redis_client: Any) -> list[tuple[str, int]]:
        """(task_id, newest row id) of every journal with 'recorded' rows and no lease."""
        with self.sessions() as session:
            found = session.execute(
                select(JOURNAL.c.task_id, func.max(JOURNAL.c.id))
                .where(JOURNAL.c.state == JournalState.RECORDED)
                .group_by(JOURNAL.c.task_id)).all()
        if not found:
            return []
        pipe = redis_client.pipeline(transaction=False)
        for task_id, _ in found:
            pipe.exists(lease_key(journal_lease_name(task_id)))
        alive = pipe.execute()
        return [(t, int(upto)) for (t, upto), held in zip(found, alive, strict=True) if not held]


# -- the process-wide journal ---------------------------------------------------------------------

_journal: Journal | None = None
_journal_lock = threading.Lock()


def journal() -> Journal:
    """This process's Journal on the platform's database and Redis (created on first use)."""
    global _journal
    with _journal_lock:
        if _journal is None:
            res = resources_for(settings)
            _journal = Journal(res.sessions, res.leases, lease_ttl=settings.lease_ttl)
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


def checkpoint(name: str, undo: str, data: dict[str, Any]) -> int:
    """Record step `name` of the running task, to be undone by compensation `undo` with `data`.

    Raises UnknownCompensation for an unregistered `undo`, TypeError for data that is not a
    JSON object, NotInTask outside a task: all before anything is written. Returns the seq.
    """
    task = current_task
    request = getattr(task, "request", None)
    task_id = getattr(request, "id", None)
    if task is None or not task_id:
        raise NotInTask("checkpoint() must be called inside a running Celery task")
    attempt = int(getattr(request, "retries", 0) or 0)
    return journal().record(task_id, task.name, attempt, name, undo, data)


def rollback(task_id: str, reason: str) -> RollbackReport:
    """Compensate what execution `task_id` recorded, in reverse order, each step at most once.

    Idempotent: a second call (here or in any process) finds nothing left and runs nothing.
    Releases this process's journal lease of `task_id` afterwards, if it holds one.
    """
    found = journal()
    try:
        return found.rollback(task_id, reason)
    finally:
        found.close(task_id)


def rollback_now(task_id: str, reason: str) -> RollbackReport:
    """Roll back at once, before Celery records the failure (e.g. on SoftTimeLimitExceeded).

    The later task_failure handler then finds nothing left to do.
    """
    return rollback(task_id, reason)


def discard(task_id: str) -> int:
    """Delete the journal of `task_id` (it succeeded) and release its lease; no undo runs."""
    return journal().discard(task_id)


def sweep(sessions: sessionmaker[Session], redis_client: Any,
          policy: RetryPolicy = COMPENSATION_POLICY) -> int:
    """Roll back every journal whose writer is gone; return how many rollbacks ran a step.

    Catches what no signal can: a hard time limit, a SIGKILLed pool process or worker. Only
    rows that existed when the sweep looked are touched (a run that starts meanwhile takes
    the lease and keeps its own rows).
    """
    sweeper = Journal(sessions, policy=policy)
    rolled = 0
    for task_id, upto in sweeper.orphans(redis_client):
        report = sweeper.rollback(task_id, "sweeper: the journal's process is gone",
                                  upto_id=upto)
        rolled += bool(report.steps)
    return rolled


# -- Celery tasks -------------------------------------------------------------------------------


@app.task(name="tasks.rollback.sweep", soft_time_limit=240, time_limit=300, acks_late=True)
def sweep_task() -> int:
    """Beat runs this every few seconds; a worker also sends one when it becomes ready."""
    res = resources_for(settings)
    return sweep(res.sessions, res.redis)


@app.task(name="tasks.rollback.rollback", soft_time_limit=240, time_limit=300, acks_late=True)
def rollback_task(task_id: str, reason: str) -> dict[str, Any]:
    """Roll back `task_id` in a pool process (sent when a running task was terminated)."""
    report = journal().rollback(task_id, reason)
    return {"task_id": task_id, "compensated": report.compensated, "dead": report.dead}


# -- triggers -------------------------------------------------------------------------------------


def _request_id(request: Any) -> str | None:
    return getattr(request, "id", None)


def _carried_over(request: Any) -> bool:
    """With ROLLBACK_ON_RETRY off, a retried task's journal may live in another process."""
    return not rollback_on_retry and int(getattr(request, "retries", 0) or 0) > 0


@task_success.connect
def _on_success(sender: Task | None = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    task_id = _request_id(request)
    current = _journal
    if task_id and current is not None and (current.holds(task_id) or _carried_over(request)):
        current.discard(task_id)


@task_failure.connect
def _on_failure(sender: Task | None = None, task_id: str | None = None,
                exception: BaseException | None = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    current = _journal
    if task_id and current is not None and (current.holds(task_id) or _carried_over(request)):
        rollback(task_id, f"task failed: {exception!r}")


@task_retry.connect
def _on_retry(request: Any = None, reason: object = None, **_: Any) -> None:
    task_id = _request_id(request)
    current = _journal
    if rollback_on_retry and task_id and current is not None and current.holds(task_id):
        rollback(task_id, f"attempt {getattr(request, 'retries', 0)} failed: {reason!r}")


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

