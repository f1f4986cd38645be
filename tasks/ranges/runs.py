"""The runs of a range job (`range_runs`) and the audit of their controls (`range_run_events`).

A run opens with `tasks.ranges.start` and ends when the reconciler's closing round finds
nothing left to do (succeeded; failed if a partition failed: `tasks.ranges.closing`) or with
`tasks.ranges.cancel`. The run row is the
source of truth for the job's controls; each reconcile round copies its state and throttle to
the job's Redis control hash (`write_flags`), which the runners read once per batch, so a
Redis flush or restart cannot un-pause a job for longer than one reconcile interval.

Every state change is a compare-and-set on the state read (`change_state`), so a control and
the reconciler's end-of-run check never both win.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from lease.keys import lease_key
from tasks.config.clock import iso
from tasks.ranges.keys import range_control_key, range_lease_name, range_schedule_name
from tasks.ranges.params import values_of
from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS, SCHEDULES, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import park_idle, partitions_of
from tasks.store.db import WRITE_INTENT, affected, utcnow

__all__ = ["Run", "Event", "current_run", "current_runs", "run_of", "runs_of", "run_numbered",
           "events_of", "record", "open_run", "change_state", "run_rows", "run_counts",
           "write_flags", "enforce", "RECONCILER", "writing", "park_unleased", "statuses",
           "stored_params", "still_latest"]

RECONCILER = "reconciler"  # the actor of the events the reconciler records


@dataclass(frozen=True)
class Run:
    """A run as `current_run` and `runs_of` return it. `id` is the global row id (what the
    events and the code refer to); `number` is what people read: the job's run 1, 2, 3...
    (`rows`: this run's rows so far; `skipped`: its rows quarantined and not retried;
    `params`: its parameters as stored, JSON text)."""

    id: int
    job: str
    state: str
    started_at: datetime
    finished_at: datetime | None
    rows: int
    rows_per_s: float | None
    rows_base: int = 0
    params: str | None = None
    number: int | None = None
    started_by: str | None = None
    skipped: int = 0

    @property
    def shown(self) -> int:
        """The run as people name it: its number in the job (its id for a run older than
        the numbers that has none)."""
        return self.number if self.number is not None else self.id

    def duration_s(self, now: datetime | None = None) -> float:
        """Seconds from its start to its end, or to `now` while it is live."""
        end = self.finished_at or now or utcnow()
        return max((end - self.started_at).total_seconds(), 0.0)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.shown, "id": self.id, "job": self.job, "state": self.state,
                "started_at": iso(self.started_at), "finished_at": iso(self.finished_at),
                "duration_s": round(self.duration_s(), 3), "started_by": self.started_by,
                "rows": self.rows, "skipped": self.skipped, "rows_per_s": self.rows_per_s,
                "params": values_of(self.params)}


@dataclass(frozen=True)
class Event:
    run_id: int
    verb: str
    actor: str
    at: datetime
    detail: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"verb": self.verb, "actor": self.actor, "at": iso(self.at),
                "detail": self.detail}


@contextmanager
def writing(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A write transaction that takes SQLite's write lock up front (BEGIN IMMEDIATE), so it
    waits for a batch in flight instead of failing with "database is locked"."""
    with sessions.begin() as session:
        session.connection(execution_options=WRITE_INTENT)
        yield session


def run_rows(session: Session, job: str) -> int:
    """The rows the job's partitions processed in the current run (`work_items.rows_done`,
    committed with each batch's checkpoint; a new run's partitions start from zero)."""
    return run_counts(session, job)[0]


def run_counts(session: Session, job: str) -> tuple[int, int]:
    """The current run's rows processed and rows skipped (quarantined, not retried): one
    aggregate over the job's partitions."""
    done, skipped = session.execute(select(
        func.coalesce(func.sum(WORK.c.rows_done), 0),
        func.coalesce(func.sum(WORK.c.rows_skipped), 0)).where(partitions_of(job))).one()
    return int(done), int(skipped)


def _run(session: Session, row: Any, counts: tuple[int, int] | None = None,
         counted: bool = True) -> Run:
    """The run of `row`; a live run's rows from its partitions (`counts`: their rows done and
    skipped, already added up; None: add them up now, unless not `counted`: then 0)."""
    rows, skipped = row.rows, row.skipped
    if row.state in RunState.LIVE:
        done, skipped = (counts if counts is not None
                         else run_counts(session, row.job) if counted else (row.rows_base, 0))
        rows = done - row.rows_base
    return Run(row.id, row.job, row.state, row.started_at, row.finished_at, max(int(rows), 0),
               row.rows_per_s, row.rows_base, row.params, row.number, row.started_by,
               max(int(skipped or 0), 0))


def current_run(sessions: sessionmaker[Session], job: str, *,
                counted: bool = True) -> Run | None:
    """The job's latest run (state, rows, started_at...), or None if it never ran. Not
    `counted`: a live run's rows and skips are left at 0, not added up over its partitions
    (a reconcile round wants the state; the sum costs it a read of every partition)."""
    with sessions() as session:
        row = session.execute(select(RANGE_RUNS).where(RANGE_RUNS.c.job == job)
                              .order_by(RANGE_RUNS.c.id.desc()).limit(1)).first()
        return _run(session, row, counted=counted) if row is not None else None


def current_runs(sessions: sessionmaker[Session],
                 counts: dict[str, tuple[int, int]]) -> dict[str, Run]:
    """The latest run of each job of `counts` (job -> its partitions' rows done and skipped,
    as `run_counts` adds them up), in one read: what `current_run` says for each, without a
    query per job (a status of 100 jobs)."""
    if not counts:
        return {}
    latest = (select(func.max(RANGE_RUNS.c.id)).where(RANGE_RUNS.c.job.in_(sorted(counts)))
              .group_by(RANGE_RUNS.c.job))
    with sessions() as session:
        rows = session.execute(select(RANGE_RUNS).where(RANGE_RUNS.c.id.in_(latest))).all()
        return {row.job: _run(session, row, counts[row.job]) for row in rows}


def run_of(sessions: sessionmaker[Session], run_id: int) -> Run | None:
    """The run `run_id` (None if there is none)."""
    with sessions() as session:
        row = session.execute(select(RANGE_RUNS).where(RANGE_RUNS.c.id == run_id)).first()
        return _run(session, row) if row is not None else None


def runs_of(sessions: sessionmaker[Session], job: str, limit: int = 20) -> list[Run]:
    """The job's latest `limit` runs, newest first."""
    with sessions() as session:
        rows = session.execute(select(RANGE_RUNS).where(RANGE_RUNS.c.job == job)
                               .order_by(RANGE_RUNS.c.id.desc()).limit(limit)).all()
        return [_run(session, row) for row in rows]


def run_numbered(sessions: sessionmaker[Session], job: str, number: int) -> Run | None:
    """The job's run `number` (None: no such run)."""
    with sessions() as session:
        row = session.execute(select(RANGE_RUNS).where(
            RANGE_RUNS.c.job == job, RANGE_RUNS.c.number == number)).first()
        return _run(session, row) if row is not None else None


def events_of(sessions: sessionmaker[Session], run_ids: list[int]) -> dict[int, list[Event]]:
    """The events of each run, oldest first."""
    found: dict[int, list[Event]] = {run_id: [] for run_id in run_ids}
    if not run_ids:
        return found
    with sessions() as session:
        for r in session.execute(select(RANGE_RUN_EVENTS).where(
                RANGE_RUN_EVENTS.c.run_id.in_(run_ids)).order_by(RANGE_RUN_EVENTS.c.id)):
            found[r.run_id].append(Event(r.run_id, r.verb, r.actor, r.at, r.detail))
    return found


def record(session: Session, run_id: int, job: str, verb: str, actor: str,
           detail: str | None = None) -> None:
    """Add an event to the run's audit (in the caller's transaction)."""
    session.execute(insert(RANGE_RUN_EVENTS).values(
        run_id=run_id, job=job, verb=verb, actor=actor[:255], detail=detail, at=utcnow()))


def still_latest(session: Session, job: str, run: Run | None) -> bool:
    """Is `run` (None: no run) still the job's latest run, in the state it was read in? (A
    control that read it before its transaction checks it again inside.)"""
    latest = session.execute(select(RANGE_RUNS.c.id, RANGE_RUNS.c.state).where(
        RANGE_RUNS.c.job == job).order_by(RANGE_RUNS.c.id.desc()).limit(1)).first()
    seen = (run.id, run.state) if run is not None else None
    return (tuple(latest) if latest is not None else None) == seen


def stored_params(session: Session, job: str) -> str | None:
    """The parameters of the job's latest run as stored (JSON text; None: none or no run):
    one indexed read, what a partition's holder builds `ctx.params` from."""
    return session.execute(select(RANGE_RUNS.c.params).where(RANGE_RUNS.c.job == job)
                           .order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar()


def open_run(session: Session, job: str, after: Run | None, actor: str,
             rows_per_s: float | None, params: str | None = None) -> tuple[int, int]:
    """A new running run of `job` with its stored `params` (in the caller's transaction):
    its id and its number, the one after `after`'s, the job's latest run as the caller
    checked it inside this transaction (`still_latest`; None: the job never ran). The number
    comes from that check, not from a second read: under PostgreSQL's READ COMMITTED each
    statement sees what committed before it, so a run another start commits between the
    check and a fresh read would give this one the next number and open a second live
    run. A start that took the same number first makes the unique (job, number)
    constraint roll this transaction back whole (`Controls.start` then joins its run)."""
    now = utcnow()
    number = (after.shown if after is not None else 0) + 1
    result = session.execute(insert(RANGE_RUNS).values(
        job=job, state=RunState.RUNNING, started_at=now, rows=0, params=params,
        rows_base=run_rows(session, job), rows_per_s=rows_per_s, updated_at=now,
        number=number, started_by=actor[:255], skipped=0))
    key = cast(CursorResult[Any], result).inserted_primary_key
    assert key is not None
    run_id = int(key[0])
    record(session, run_id, job, "start", actor,
           f"rows_per_s={rows_per_s:g}" if rows_per_s else None)
    return run_id, number


def change_state(session: Session, run: Run, to: str, **values: Any) -> bool:
    """Compare-and-set the run's state from `run.state` to `to`; an ended run gets its
    finished time and its final rows. False if someone changed it first."""
    values.update(state=to, updated_at=utcnow())
    if to in RunState.ENDED:
        done, skipped = run_counts(session, run.job)
        values.update(finished_at=utcnow(), rows=done - run.rows_base, skipped=skipped)
        # The hooks' outbox (tasks.ranges.hooks): the end's hook is owed from this commit.
        values.update(hook=to, hook_task=None, hook_sent_at=None)
    elif to in RunState.LIVE:
        values.setdefault("finished_at", None)
    return affected(session.execute(update(RANGE_RUNS).where(
        RANGE_RUNS.c.id == run.id, RANGE_RUNS.c.state == run.state).values(**values))) == 1


def write_flags(client: Any, run: Run | None) -> None:
    """Copy the run's control state and throttle to the job's control hash (one round trip);
    fields with nothing to say are deleted (and the hash with its last field)."""
    if run is None:
        return
    key = range_control_key(run.job)
    stop = run.state if run.state in (RunState.PAUSED, RunState.CANCELLED) else None
    rate = run.rows_per_s if run.state in RunState.LIVE and run.rows_per_s else None
    values = {"state": stop, "rate": rate}
    gone = [field for field, value in values.items() if value is None]
    fields = {field: value for field, value in values.items() if value is not None}
    # Not a MULTI (a Redis Cluster client pipelines without one): the two commands touch
    # different fields, so a runner reading between them sees nothing inconsistent.
    with client.pipeline(transaction=False) as pipe:
        if gone:
            pipe.hdel(key, *gone)
        if fields:
            pipe.hset(key, mapping=fields)
        pipe.execute()


def statuses(session: Session, job: str) -> dict[str, int]:
    """How many of the job's partitions are in each state."""
    return {status: int(n) for status, n in session.execute(
        select(WORK.c.status, func.count()).where(partitions_of(job))
        .group_by(WORK.c.status)).all()}


def park_unleased(sessions: sessionmaker[Session], client: Any, job: str) -> int:
    """Open partitions of a paused or cancelled job that nobody works become paused: pending
    ones (a holder that lost its lease hands its partition back as pending), and running ones
    whose lease nobody holds (their holder died or lost it; its fenced writes need
    `running`, so a holder that wakes up writes nothing). Returns how many were parked."""
    with sessions() as session:
        found = session.execute(select(WORK.c.part, WORK.c.fence, WORK.c.status).where(
            partitions_of(job), WORK.c.status.in_(S.OPEN))).all()
    running = [r for r in found if r.status == S.RUNNING]
    with client.pipeline(transaction=False) as pipe:
        for r in running:
            pipe.exists(lease_key(range_lease_name(job, r.part)))
        held = {r.part for r, h in zip(running, pipe.execute(), strict=True) if h}
    idle = [r for r in found if r.part not in held]
    if not idle:
        return 0
    parked = 0
    with writing(sessions) as session:
        for r in idle:
            parked += park_idle(session, job, r.part, r.fence, r.status)
    return parked


def enforce(sessions: sessionmaker[Session], client: Any, job: str) -> str | None:
    """A reconcile round's first step: the job's run state (None: no run recorded), copied
    to Redis; a paused or cancelled job's dead holders' partitions are parked, and a
    cancelled job with nothing running any more stops being reconciled."""
    run = current_run(sessions, job, counted=False)
    write_flags(client, run)
    if run is None or run.state not in (RunState.PAUSED, RunState.CANCELLED):
        return run.state if run is not None else None
    park_unleased(sessions, client, job)
    if run.state == RunState.CANCELLED:
        with writing(sessions) as session:
            if not statuses(session, job).get(S.RUNNING):
                session.execute(update(SCHEDULES).where(
                    SCHEDULES.c.name == range_schedule_name(job)).values(active=False))
    return run.state
