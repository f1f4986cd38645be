"""Range jobs' cron schedules in the database (`range_job_schedules`), and the tick that fires
them (the expressions and policies: `tasks.ranges.cron`).

A job declares `schedule=` in code, or an operator sets, changes or clears one at runtime
(`python -m tasks jobs schedule JOB "0 2 * * *" --policy queue --missed skip`). A row seeded
from the code (`source` code) follows the code when it changes; a row set at runtime
(`source` runtime) is kept until set again, a cleared one included.

Beat, on the leader only, emits `tasks.ranges.schedules` every RANGE_SCHEDULE_TICK seconds;
the tick reads the due rows and, for each, decides from the job's current run and the
policies, then writes its decision as one compare-and-set on the row's `term`:

    t0  beats A and B (a paused ex-leader) both read the row at term 7, due 02:00:00
    t1  A: no live run -> `start_job(..., then=advance)`: the run opens and, in the same
        transaction, `UPDATE ... SET term = 8, next_due_at = <next> WHERE term = 7`
    t2  B: the same start; its `then` matches no row, so its transaction rolls back (no run)

so each due time fires once, and a fire that crashed before committing is fired again by the
next tick. The run it starts is an ordinary run (`tasks.ranges.start`'s path) whose audit says
who started it (`start` by `schedule`) and for which due time (`scheduled`, "due ...Z"); a
fire that starts nothing (skipped, queued) is recorded on the live run (`schedule-skip`,
`schedule-queue`) and counted on the schedule row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tasks.config.clock import iso
from tasks.ranges.controls import Overtaken, Then
from tasks.ranges.cron import (
    Due,
    InvalidSchedule,
    due_at,
    parse_cron,
    validate_missed,
    validate_policy,
)
from tasks.ranges.jobs import RangeJob
from tasks.ranges.runs import Run, current_run, record, writing
from tasks.ranges.tables import JOB_SCHEDULES, RANGE_RUNS, RunState
from tasks.store.db import affected, utcnow
from tasks.store.validate import InvalidArguments

__all__ = ["ACTOR", "Fire", "Start", "Cancel", "set_schedule", "clear_schedule", "seed",
           "tick", "views"]

log = logging.getLogger("tasks.ranges")

ACTOR = "schedule"  # who the runs a schedule starts, and its records, say started them

# start_job(job, actor, then): opens the run; `then` commits with it.
Start = Callable[[str, str, Then], object]
# cancel(job, actor): the `replace` policy's cancel of the live run.
Cancel = Callable[[str, str], object]


@dataclass(frozen=True)
class Fire:
    """What a tick did with one schedule's due time."""

    job: str
    outcome: str  # started, replaced, queued, skipped, missed, error, overtaken
    due: datetime
    run: int | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "outcome": self.outcome, "due": iso(self.due),
                "run": self.run, "detail": self.detail}


def set_schedule(sessions: sessionmaker[Session], job: RangeJob, cron: object,
                 policy: object = "skip", missed: object = "once",
                 now: datetime | None = None) -> dict[str, Any]:
    """Set (or change) the job's schedule at runtime; everything is checked first
    (`InvalidSchedule`, nothing stored). Its next due time is the first after `now`."""
    parsed = parse_cron(cron)
    values = {"cron": parsed.expr, "policy": validate_policy(policy),
              "missed": validate_missed(missed)}
    try:
        job.make_params(None)
    except InvalidArguments as exc:
        raise InvalidSchedule(f"schedule {job.name}: a scheduled run starts with the job's "
                              f"default parameters, and they are refused: {exc}") from None
    now = now or utcnow()
    _upsert(sessions, job.name, source="runtime", next_due_at=parsed.after(now), **values)
    return {"job": job.name, **values, "next_due": iso(parsed.after(now))}


def clear_schedule(sessions: sessionmaker[Session], job: RangeJob) -> None:
    """No more scheduled runs of the job (a schedule declared in code included) until one is
    set again; a queued run is dropped."""
    _upsert(sessions, job.name, source="runtime", cron=None, next_due_at=None)


def _upsert(sessions: sessionmaker[Session], job: str, **values: Any) -> None:
    now = utcnow()
    values.update(queued_due_at=None, updated_at=now)
    with writing(sessions) as session:
        changed = affected(session.execute(update(JOB_SCHEDULES).where(
            JOB_SCHEDULES.c.job == job).values(term=JOB_SCHEDULES.c.term + 1, **values)))
        if not changed:
            values.setdefault("policy", "skip")
            values.setdefault("missed", "once")
            session.execute(insert(JOB_SCHEDULES).values(job=job, term=0, fired=0, skipped=0,
                                                         **values))


def seed(sessions: sessionmaker[Session], jobs: Sequence[RangeJob], now: datetime) -> None:
    """Rows for the schedules declared in code: added when missing, changed when the code
    changed them (unless an operator set the row at runtime)."""
    with sessions() as session:
        rows = {r.job: r for r in session.execute(select(JOB_SCHEDULES)).all()}
    for job in jobs:
        row = rows.get(job.name)
        declared = (job.schedule, job.schedule_policy, job.schedule_missed)
        if row is not None and (row.source != "code" or (row.cron, row.policy,
                                                         row.missed) == declared):
            continue
        if row is None and job.schedule is None:
            continue
        next_due = parse_cron(job.schedule).after(now) if job.schedule is not None else None
        try:
            _upsert(sessions, job.name, source="code", cron=job.schedule,
                    policy=job.schedule_policy, missed=job.schedule_missed,
                    next_due_at=next_due)
        except IntegrityError:  # another tick added it first
            continue


def tick(sessions: sessionmaker[Session], jobs: Sequence[RangeJob], start: Start,
         cancel: Cancel, *, grace: float, now: datetime | None = None) -> list[Fire]:
    """Fire every due schedule of `jobs` (the leader beat's tick, `tasks.ranges.schedules`)."""
    now = now or utcnow()
    seed(sessions, jobs, now)
    known = {job.name for job in jobs}
    with sessions() as session:
        rows = session.execute(select(JOB_SCHEDULES).where(
            JOB_SCHEDULES.c.cron.is_not(None),
            or_(JOB_SCHEDULES.c.next_due_at <= now, JOB_SCHEDULES.c.queued_due_at.is_not(None)))
            .order_by(JOB_SCHEDULES.c.job)).all()
    fires = []
    for row in rows:
        if row.job not in known:
            continue
        fire = _fire(sessions, row, start, cancel, now, grace)
        if fire is not None:
            log.info("schedule %s: %s (due %s) %s", fire.job, fire.outcome, iso(fire.due),
                     fire.detail)
            fires.append(fire)
    return fires


def _fire(sessions: sessionmaker[Session], row: Any, start: Start, cancel: Cancel,
          now: datetime, grace: float) -> Fire | None:
    """One schedule's due time (or its queued run), by its policies."""
    due = due_at(parse_cron(row.cron), row.next_due_at, now, grace) \
        if row.next_due_at is not None else None
    run = current_run(sessions, row.job)
    live = run if run is not None and run.state in RunState.LIVE else None
    if due is None:  # only a queued run waiting for the live one to end
        if live is not None:
            return None
        queued = row.queued_due_at
        return _start(sessions, row, start, queued, f"due {iso(queued)} (queued)",
                      next_due_at=row.next_due_at, outcome="started")
    if due.late and row.missed == "skip":
        return _skip(sessions, row, live, due, "missed")
    if live is None and row.queued_due_at is not None:
        # The live run ended and a due time of its own came before the next tick: one run,
        # started for the queued due time, with this one folded into it.
        queued = row.queued_due_at
        return _start(sessions, row, start, queued,
                      f"due {iso(queued)} (queued), with {due.detail()}",
                      next_due_at=due.next_at)
    if live is None:
        return _start(sessions, row, start, due.at, due.detail(), next_due_at=due.next_at)
    if row.policy == "replace":
        try:
            cancel(row.job, ACTOR)
        except InvalidArguments:
            pass  # it ended (or was cancelled by another tick) meanwhile: start anyway
        return _start(sessions, row, start, due.at, f"{due.detail()}, replacing run {live.shown}",
                      next_due_at=due.next_at, outcome="replaced")
    if row.policy == "queue" and row.queued_due_at is None:
        return _queue(sessions, row, live, due)
    return _skip(sessions, row, live, due, "skipped")


def _advance(session: Session, row: Any, **values: Any) -> bool:
    """The compare-and-set of a fire: the row is still at the term it was read at."""
    return affected(session.execute(update(JOB_SCHEDULES).where(
        JOB_SCHEDULES.c.job == row.job, JOB_SCHEDULES.c.term == row.term)
        .values(term=row.term + 1, updated_at=utcnow(), **values))) == 1


def _start(sessions: sessionmaker[Session], row: Any, start: Start, due: datetime,
           detail: str, *, next_due_at: datetime | None, outcome: str = "started") -> Fire:
    """Start the job's run through `start_job`; the row advances in the run's transaction."""
    opened: list[int] = []

    def then(session: Session, run_id: int) -> bool:
        number = session.execute(select(RANGE_RUNS.c.number).where(
            RANGE_RUNS.c.id == run_id)).scalar()
        if not _advance(session, row, next_due_at=next_due_at, queued_due_at=None,
                        last_due_at=due, last_outcome=f"{outcome} run {number or run_id}",
                        fired=row.fired + 1):
            return False
        record(session, run_id, row.job, "scheduled", ACTOR, f"{detail}; policy {row.policy}")
        opened.append(run_id)
        return True

    try:
        start(row.job, ACTOR, then)
    except Overtaken:
        return Fire(row.job, "overtaken", due)
    except InvalidArguments as exc:  # the job cannot start now: recorded, not retried each tick
        reason = " ".join(str(exc).split())
        with writing(sessions) as session:
            _advance(session, row, next_due_at=next_due_at, queued_due_at=None,
                     last_due_at=due, last_outcome=f"error: {reason}"[:255],
                     skipped=row.skipped + 1)
        return Fire(row.job, "error", due, detail=reason)
    return Fire(row.job, outcome, due, opened[0] if opened else None, detail)


def _skip(sessions: sessionmaker[Session], row: Any, live: Run | None, due: Due,
          outcome: str) -> Fire:
    """A due time that starts nothing: recorded on the live run, counted on the row."""
    why = (f"run {live.shown} is {live.state}" if outcome == "skipped" and live is not None
           else "missed while no beat ran (missed-run policy skip)")
    if outcome == "skipped" and row.queued_due_at is not None:
        why += f"; a run is already queued for {iso(row.queued_due_at)}"
    detail = f"{due.detail()}: {why}"
    with writing(sessions) as session:
        if not _advance(session, row, next_due_at=due.next_at, last_due_at=due.at,
                        last_outcome=outcome, skipped=row.skipped + 1):
            return Fire(row.job, "overtaken", due.at)
        if live is not None:
            record(session, live.id, row.job, "schedule-skip", ACTOR, detail)
    return Fire(row.job, outcome, due.at, live.id if live is not None else None, detail)


def _queue(sessions: sessionmaker[Session], row: Any, live: Run, due: Due) -> Fire:
    """The `queue` policy: one run waits for the live one to end."""
    detail = f"{due.detail()}: queued until run {live.shown} ends"
    with writing(sessions) as session:
        if not _advance(session, row, next_due_at=due.next_at, queued_due_at=due.at,
                        last_due_at=due.at, last_outcome="queued"):
            return Fire(row.job, "overtaken", due.at)
        record(session, live.id, row.job, "schedule-queue", ACTOR, detail)
    return Fire(row.job, "queued", due.at, live.id, detail)


def views(sessions: sessionmaker[Session], jobs: Sequence[RangeJob]) -> list[dict[str, Any]]:
    """Every schedule as stored (and a declared one not yet seeded by a tick), by job."""
    with sessions() as session:
        rows = {r.job: r for r in session.execute(select(JOB_SCHEDULES)).all()}
    found = []
    for job in sorted({*rows, *(j.name for j in jobs if j.schedule)}):
        row = rows.get(job)
        if row is None:
            declared = next(j for j in jobs if j.name == job)
            found.append({"job": job, "cron": declared.schedule, "source": "code",
                          "policy": declared.schedule_policy,
                          "missed": declared.schedule_missed, "next_due": None,
                          "queued": None, "last_due": None, "last_outcome": None,
                          "fired": 0, "skipped": 0})
            continue
        found.append({"job": job, "cron": row.cron, "source": row.source,
                      "policy": row.policy, "missed": row.missed,
                      "next_due": iso(row.next_due_at), "queued": iso(row.queued_due_at),
                      "last_due": iso(row.last_due_at), "last_outcome": row.last_outcome,
                      "fired": int(row.fired), "skipped": int(row.skipped)})
    return found
