"""Skipped rows run again: `python -m tasks jobs retry-skipped JOB` (every row the job's latest
run quarantined, `tasks.ranges.skips`) and `python -m tasks deadletters replay ID` of a
`range-skip` letter (that one row) do the same thing.

A retry takes the row out of quarantine and lets the run's normal path process it:

    one transaction
      claim the letter: UPDATE dead_letters SET replayed_at = now ... WHERE id = :letter
                        AND replayed_at IS NULL  (a second retry of it claims nothing)
      the partition holding the row, if finished (done or empty), goes back to pending
        (paused, if the run is) with its keyset pass from `lo`
      the run's skipped count drops by one (the row is the current run's)
      an ended run (succeeded or failed) is running again, its job reconciled at once;
        recorded as `retry-skipped` with who asked
    then a holder claims the partition under its lease and fence and reads it with the
    job's filter: the row, no longer left out, is processed in a batch that commits with the
    checkpoint, once. A row that no longer matches the filter is not read at all. A row that
    fails again is quarantined again (a new letter, counted skipped again). A partition that
    is running or pending keeps its pass; the run's closing round finds the row and reopens
    it. A failed partition stays failed: `retry-failed` runs it again, and the row with it
    (or, below its checkpoint, through the closing round). After a cancelled run the next
    `start` takes the row (it is no longer quarantined). A letter of an older run counts off
    that run's skipped rows, and its row runs in the job's latest run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletters.store import AlreadyReplayed, LetterNotFound
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.ranges.keys import range_schedule_name
from tasks.ranges.runs import Run, change_state, current_run, record, writing
from tasks.ranges.skips import SKIP_KIND
from tasks.ranges.tables import RANGE_RUNS, SCHEDULES, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import partitions_of
from tasks.store.db import affected, utcnow
from tasks.store.validate import InvalidArguments

__all__ = ["Skipped", "NothingToRetry", "skipped_of", "retry_rows", "replay_skip"]

RETRY_VERB = "retry-skipped"


class NothingToRetry(InvalidArguments):
    """The job's latest run has no skipped row left to retry; nothing was changed."""


@dataclass(frozen=True)
class Skipped:
    """A quarantined row as its letter keeps it."""

    letter: int
    job: str
    row_id: int
    run: int | None  # the id of the run that quarantined it (None: a letter older than that)


def _skipped(row: Any) -> Skipped | None:
    try:
        payload = json.loads(row.payload)
        run = payload.get("run")
        return Skipped(int(row.id), str(payload["job"]), int(payload["row_id"]),
                       int(run) if run else None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # not a letter this module wrote: left alone


def skipped_of(session: Session, job: str, run_id: int | None = None) -> list[Skipped]:
    """The rows of `job` still quarantined (of the run `run_id`, when given), oldest first."""
    d = DEAD_LETTERS.c
    rows = session.execute(select(d.id, d.payload).where(
        d.kind == SKIP_KIND, d.replayed_at.is_(None),
        d.ref.startswith(f"{job}:", autoescape=True)).order_by(d.id)).all()
    found = [s for s in map(_skipped, rows) if s is not None and s.job == job]
    return [s for s in found if run_id is None or s.run == run_id]


def retry_rows(sessions: sessionmaker[Session], job: str, actor: str) -> dict[str, Any]:
    """Retry every row `job`'s latest run quarantined (see the module's docstring); its
    report. `NothingToRetry` (nothing changed) when there is none; `InvalidArguments` when
    the job never ran."""
    run = current_run(sessions, job)
    if run is None:
        raise InvalidArguments(f"retry-skipped {job}: the job has no run; start it first")
    with writing(sessions) as session:
        rows = skipped_of(session, job, run.id)
        if not rows:
            raise NothingToRetry(f"retry-skipped {job}: run {run.shown} has no skipped rows "
                                 "to retry")
        retried = _retry(session, run, rows, actor)
        if not retried:
            raise NothingToRetry(f"retry-skipped {job}: run {run.shown}'s skipped rows were "
                                 "retried meanwhile; nothing left to retry")
    return {"job": job, "run": run.shown, "state": _state_after(run), "retried": retried}


def replay_skip(sessions: sessionmaker[Session], letter_id: int) -> str:
    """A `range-skip` letter's replay (`tasks.deadletters.kinds.Retry`): its row is retried
    like `retry_rows` retries the latest run's rows, whichever run quarantined it."""
    d = DEAD_LETTERS.c
    with writing(sessions) as session:
        row = session.execute(select(d.id, d.payload, d.replayed_at, d.replay_task_id)
                              .where(d.id == letter_id, d.kind == SKIP_KIND)).first()
        if row is None:
            raise LetterNotFound(letter_id)
        skipped = _skipped(row)
        if skipped is None:
            raise LetterNotFound(letter_id)
        run = _current(session, skipped.job)
        if not _retry(session, run, [skipped], f"replay of dead letter {letter_id}"):
            raise AlreadyReplayed(letter_id, row.replayed_at, row.replay_task_id)
    if run is None or run.state == RunState.CANCELLED:
        where = f"{skipped.job}'s next run"
    else:
        where = f"run {run.shown} of {skipped.job} ({_state_after(run)})"
    return f"row {skipped.row_id} is out of quarantine and runs again in {where}"


def _current(session: Session, job: str) -> Run | None:
    row = session.execute(select(RANGE_RUNS).where(RANGE_RUNS.c.job == job)
                          .order_by(RANGE_RUNS.c.id.desc()).limit(1)).first()
    if row is None:
        return None
    return Run(row.id, row.job, row.state, row.started_at, row.finished_at, int(row.rows),
               row.rows_per_s, row.rows_base, row.params, row.number, row.started_by,
               int(row.skipped or 0))


def _state_after(run: Run | None) -> str:
    if run is None:
        return "no run"
    return RunState.RUNNING if run.state in (RunState.SUCCEEDED, RunState.FAILED) \
        else run.state


def _retry(session: Session, run: Run | None, rows: list[Skipped], actor: str) -> int:
    """Claim each row's letter, reopen its finished partition, count it no longer skipped,
    and bring an ended run back to running (in the caller's transaction). Returns how many
    letters this call claimed (the others were claimed by a retry that came first)."""
    mine = f"{RETRY_VERB} run {run.shown}" if run is not None else RETRY_VERB
    claimed = [r for r in rows if affected(session.execute(
        update(DEAD_LETTERS).where(DEAD_LETTERS.c.id == r.letter,
                                   DEAD_LETTERS.c.replayed_at.is_(None))
        .values(replayed_at=utcnow(), replay_task_id=mine[:255]))) == 1]
    if not claimed or run is None:
        return len(claimed)
    job = run.job
    cancelled = run.state == RunState.CANCELLED
    to = S.PAUSED if run.state == RunState.PAUSED else S.PENDING
    for r in claimed:
        # A skip policy needs an integer key (tasks.ranges.jobs), so `lo..hi` are its ids.
        holding = (partitions_of(job), WORK.c.lo <= r.row_id, WORK.c.hi >= r.row_id)
        if r.run == run.id and not cancelled:  # counted on its partition while it is live
            session.execute(update(WORK).where(*holding, WORK.c.rows_skipped > 0)
                            .values(rows_skipped=WORK.c.rows_skipped - 1))
        elif r.run is not None:  # an ended run's count is on its row
            session.execute(update(RANGE_RUNS).where(
                RANGE_RUNS.c.id == r.run, RANGE_RUNS.c.skipped > 0)
                .values(skipped=RANGE_RUNS.c.skipped - 1))
        if not cancelled:
            session.execute(update(WORK).where(*holding, WORK.c.status.in_((S.DONE, S.EMPTY)))
                            .values(status=to, next_id=WORK.c.lo, next_key=WORK.c.lo_key,
                                    finished_at=None, dispatched_at=None))
    if run.state in (RunState.SUCCEEDED, RunState.FAILED):
        if not change_state(session, run, RunState.RUNNING):
            raise InvalidArguments(f"{RETRY_VERB} {job}: run {run.shown} changed while this "
                                   "retry ran; nothing was changed, try again")
    if not cancelled:
        session.execute(update(SCHEDULES).where(SCHEDULES.c.name == range_schedule_name(job))
                        .values(next_run_at=utcnow(), active=True))
    record(session, run.id, job, RETRY_VERB, actor, f"rows={len(claimed)}")
    return len(claimed)
