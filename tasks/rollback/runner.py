"""The rollback runner: compensates a journal's pending steps newest first, each at most once.

A runner claims a row with `UPDATE ... SET state='compensating' WHERE id=:id AND state IN
('intended','recorded')`. Runners go in reverse seq order and stop at the first claim they
lose, because whoever won it is at or past that step and owns the rest; so two runners never
compensate steps out of order. A compensation that keeps failing is retried with
COMPENSATION_POLICY, then dead-lettered (state 'dead'), and the remaining steps still run.

A runner works under an `Ownership`: the journal's owners row as its caller took or read it.
Each claim and each finished step first matches that row in its transaction, so a takeover
(which changes the row) fences the runner out: it can claim nothing more and finish nothing,
and stops. A runner that just took the journal over by compare-and-set `adopt`s the rows
left 'compensating': they were claimed under an earlier owner, now fenced, who may have died
or hung inside the compensation, so it runs them again (compensations are idempotent).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletters.store import DeadLetters
from tasks.observe.metrics import record
from tasks.rollback.errors import UnknownCompensation
from tasks.rollback.metrics import RollbackSeries
from tasks.rollback.registry import resolve
from tasks.rollback.signals import (
    rollback_finished,
    rollback_started,
    rollback_step_failed,
    rollback_step_succeeded,
)
from tasks.rollback.tables import JOURNAL, OWNERS, JournalState
from tasks.store.db import affected, utcnow
from tasks.worker.retry import RetryPolicy, decide

__all__ = ["COMPENSATION_POLICY", "STUCK_AFTER", "Ownership", "RollbackReport",
           "RollbackRunner", "StepOutcome"]

log = logging.getLogger("tasks.rollback")

# Inline retries of a failing compensation: short, because they run inside a task or the
# sweeper; what still fails goes to the dead-letter store.
COMPENSATION_POLICY = RetryPolicy(max_retries=3, initial_interval=0.2, max_interval=1.0,
                                  randomization=0.25)

# A step 'compensating' for longer than this is taken to be stuck under a runner that died:
# a rollback goes on with the older steps, and the sweeper takes the journal over again and
# runs that step once more.
STUCK_AFTER = 120.0


@dataclass(frozen=True)
class Ownership:
    """The owners row (`owner`, `state`) a runner compensates under; any change to the row
    fences the runner out."""

    owner: str
    state: str


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


class RollbackRunner:
    """Runs the compensations of the journals on one database.

    `policy` retries a failing compensation inline; `sleep` is the seam tests use to skip its
    delays. Needs no Redis: any process with the database can roll a journal back.
    """

    def __init__(self, sessions: sessionmaker[Session],
                 policy: RetryPolicy = COMPENSATION_POLICY,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.sessions = sessions
        self.policy = policy
        self.sleep = sleep
        self.dead_letters = DeadLetters(sessions)

    def rollback(self, task_id: str, reason: str, *, upto_id: int | None = None,
                 attempt: int | None = None, ownership: Ownership | None = None,
                 adopt: bool = False) -> RollbackReport:
        """Compensate the pending steps of `task_id` in reverse seq order, each at most once.

        `upto_id` limits it to rows with id <= upto_id (the sweeper's snapshot, so a new run
        that started after it is left alone); `attempt` to one attempt's rows. `ownership`
        fences every write (default: the owners row as it is now); with `adopt` (the caller
        just took the journal over by compare-and-set) rows left 'compensating' run again.
        """
        steps = self.steps(task_id, upto_id=upto_id, attempt=attempt)
        todo = JournalState.PENDING + ((JournalState.COMPENSATING,) if adopt else ())
        rows = [r for r in steps if r.state in todo]
        if not rows:
            return RollbackReport(task_id, reason)
        if ownership is None:
            ownership = self.ownership(task_id)
        sender = rows[0].task_name
        rollback_started.send(sender=sender, task_id=task_id, reason=reason,
                              seqs=[r.seq for r in rows])
        outcomes, handed_over = self._walk(task_id, sender, steps, ownership, adopt)
        report = RollbackReport(task_id, reason, tuple(outcomes), handed_over)
        if record.on is not None:
            steps_metric = record.on.of(RollbackSeries).rollback_steps
            steps_metric.labels("compensated").inc(len(report.compensated))
            steps_metric.labels("failed").inc(len(report.dead))
        log.info("rollback of %s (%s): compensated %s, dead %s%s", task_id, reason,
                 report.compensated, report.dead, ", handed over" if handed_over else "")
        rollback_finished.send(sender=sender, task_id=task_id, reason=reason, report=report)
        return report

    def _walk(self, task_id: str, sender: str, steps: list[Any], ownership: Ownership | None,
              adopt: bool) -> tuple[list[StepOutcome], bool]:
        """Claim and compensate `steps` newest first: (outcomes, handed over)."""
        outcomes: list[StepOutcome] = []
        stuck_before = utcnow() - timedelta(seconds=STUCK_AFTER)
        for row in steps:  # newest first, whatever their state
            if row.state == JournalState.COMPENSATING and adopt:
                # Claimed under an earlier owner, fenced out by our takeover: ours now.
                log.warning("step %s:%d was left compensating by the journal's previous "
                            "owner: compensating it again", task_id, row.seq)
                claimed = self._move(task_id, ownership, row.id, (JournalState.COMPENSATING,),
                                     JournalState.COMPENSATING)
            elif row.state == JournalState.COMPENSATING and row.updated_at > stuck_before:
                # Another runner is on this step, so it owns the ones below it too: going
                # on would undo an older step before a newer one.
                return outcomes, True
            elif row.state not in JournalState.PENDING:
                continue  # done, dead, or stuck under a runner that died (the sweeper's)
            else:
                claimed = self._move(task_id, ownership, row.id, JournalState.PENDING,
                                     JournalState.COMPENSATING)
            found = self._compensate(task_id, sender, row, ownership) if claimed else None
            if found is None:  # lost the claim, or fenced out: the winner owns the rest
                return outcomes, True
            outcomes.append(found)
        return outcomes, False

    def ownership(self, task_id: str) -> Ownership | None:
        """The journal's owners row as it is now (None: a journal from before owners rows,
        whose runners are fenced by the row states only)."""
        with self.sessions() as session:
            row = session.execute(select(OWNERS.c.owner, OWNERS.c.state)
                                  .where(OWNERS.c.task_id == task_id)).first()
        return None if row is None else Ownership(row.owner, row.state)

    def steps(self, task_id: str, states: tuple[str, ...] | None = None,
              upto_id: int | None = None, attempt: int | None = None) -> list[Any]:
        """The journal rows of `task_id`, newest first, optionally only some of them."""
        query = select(JOURNAL).where(JOURNAL.c.task_id == task_id).order_by(JOURNAL.c.seq.desc())
        if states is not None:
            query = query.where(JOURNAL.c.state.in_(states))
        if upto_id is not None:
            query = query.where(JOURNAL.c.id <= upto_id)
        if attempt is not None:
            query = query.where(JOURNAL.c.attempt == attempt)
        with self.sessions() as session:
            return list(session.execute(query).all())

    def compensate_late(self, task_id: str, seq: int) -> None:
        """Step `seq` may have taken effect after its journal was taken over: if the sweeper
        already compensated it (or is doing so), run its compensation once more."""
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

    @staticmethod
    def _owns(session: Session, task_id: str, ownership: Ownership | None) -> bool:
        """Match `ownership` in `session`'s transaction (the UPDATE locks the owners row, so a
        takeover is ordered before or after the whole transaction)."""
        if ownership is None:
            return True
        return affected(session.execute(update(OWNERS).where(
            OWNERS.c.task_id == task_id, OWNERS.c.owner == ownership.owner,
            OWNERS.c.state == ownership.state,
        ).values(updated_at=utcnow()))) == 1

    def _move(self, task_id: str, ownership: Ownership | None, row_id: int,
              old: tuple[str, ...], new: str, error: str | None = None) -> bool:
        """Move row `row_id` from a state in `old` to `new` while `ownership` holds."""
        with self.sessions.begin() as session:
            if not self._owns(session, task_id, ownership):
                log.warning("rollback of %s: fenced out, the journal changed owner", task_id)
                return False
            return affected(session.execute(
                update(JOURNAL).where(JOURNAL.c.id == row_id, JOURNAL.c.state.in_(old))
                .values(state=new, error=error, updated_at=utcnow()))) == 1

    def _run_compensation(self, task_id: str, row: Any) -> tuple[int, Exception | None]:
        """Call one row's compensation with the policy's retries: (calls, last error)."""
        data = json.loads(row.data)
        attempts = 0
        while True:
            attempts += 1
            try:
                resolve(row.compensation)(data)
            except Exception as exc:  # a compensation's failure is recorded, never raised
                delay = decide(self.policy, exc, attempts - 1)
                if delay is None or isinstance(exc, UnknownCompensation):
                    return attempts, exc
                log.info("compensation %s of %s:%d failed (%r); retry in %.2fs",
                         row.compensation, task_id, row.seq, exc, delay)
                self.sleep(delay)
                continue
            return attempts, None

    def _compensate(self, task_id: str, sender: str, row: Any,
                    ownership: Ownership | None) -> StepOutcome | None:
        """Run one claimed row's compensation; dead-letter it if it keeps failing. None: the
        runner was fenced out meanwhile (the new owner runs the step again) and wrote nothing."""
        step = {"task_id": task_id, "seq": row.seq, "name": row.name,
                "compensation": row.compensation, "data": json.loads(row.data)}
        attempts, exc = self._run_compensation(task_id, row)
        if exc is not None:
            return self._bury(sender, row, step, ownership, attempts, exc)
        if not self._move(task_id, ownership, row.id, (JournalState.COMPENSATING,),
                          JournalState.COMPENSATED):
            return None
        rollback_step_succeeded.send(sender=sender, attempts=attempts, **step)
        return StepOutcome(row.seq, row.name, row.compensation, JournalState.COMPENSATED,
                           attempts)

    def _bury(self, sender: str, row: Any, step: dict[str, Any], ownership: Ownership | None,
              attempts: int, exc: Exception) -> StepOutcome | None:
        error = f"{type(exc).__name__}: {exc}"
        task_id = step["task_id"]
        # Fenced out: the new owner runs this step again, and its outcome is the one to keep.
        with self.sessions.begin() as session:
            if not self._owns(session, task_id, ownership):
                return None
        # The letter first: a crash between the two writes leaves a letter for a row still
        # 'compensating', never a 'dead' row without its letter.
        self.dead_letters.add(
            "compensation", ref=f"{task_id}:{row.seq}",
            reason=f"compensation {row.compensation!r} failed {attempts} time(s): {error}",
            payload={**step, "task_name": row.task_name, "attempt": row.attempt,
                     "error": error})
        self._move(task_id, ownership, row.id, (JournalState.COMPENSATING,), JournalState.DEAD,
                   error=error)
        rollback_step_failed.send(sender=sender, attempts=attempts, error=error, **step)
        return StepOutcome(row.seq, row.name, row.compensation, JournalState.DEAD, attempts,
                           error)
