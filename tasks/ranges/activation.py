"""Which range jobs the reconciler rounds: a job is active while its schedule row says so
(`activate` at start, made due at once by `due_now`), and `repair_inactive` reactivates a job
whose run is live though nothing reconciles it. The reconciler (`tasks.ranges.reconciler`)
re-exports these."""

from __future__ import annotations

import logging

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.jobs import RangeJob
from tasks.ranges.keys import RANGE_PREFIX, job_of_schedule
from tasks.ranges.keys import range_schedule_name as schedule_name
from tasks.ranges.runs import current_run
from tasks.ranges.tables import SCHEDULES, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import partitions_of
from tasks.store.db import affected, utcnow

__all__ = ["activate", "activate_in", "due_now", "active_jobs", "repair_inactive"]

log = logging.getLogger("tasks.ranges")


def activate(sessions: sessionmaker[Session], job: RangeJob) -> int:
    """Mark `job` active (beat reconciles it from now on); reset its failed partitions.
    Returns how many failed partitions go back to pending."""
    with sessions.begin() as session:
        return activate_in(session, job.name)


def activate_in(session: Session, job: str) -> int:
    """`activate`, in the caller's transaction (a `start` opens its run in the same one)."""
    _schedule_on(session, job)
    return affected(session.execute(
        update(WORK).where(partitions_of(job),
                           WORK.c.status == S.FAILED)
        .values(status=S.PENDING, error=None, dispatched_at=None, crashes=0)
    ))


def _schedule_on(session: Session, job: str) -> None:
    """The job's schedule row is active and due now (made if missing)."""
    name = schedule_name(job)
    now = utcnow()
    updated = affected(session.execute(update(SCHEDULES).where(SCHEDULES.c.name == name)
                                       .values(active=True, next_run_at=now, updated_at=now)))
    if not updated:
        session.execute(insert(SCHEDULES).values(
            name=name, term=0, next_run_at=now, active=True, updated_at=now))


def due_now(sessions: sessionmaker[Session], job: str) -> None:
    """The job's next round may run at once (an active job only: an ended run stays ended)."""
    with sessions.begin() as session:
        session.execute(update(SCHEDULES).where(SCHEDULES.c.name == schedule_name(job),
                                                SCHEDULES.c.active.is_(True))
                        .values(next_run_at=utcnow()))


def active_jobs(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        names = session.execute(select(SCHEDULES.c.name).where(
            SCHEDULES.c.active.is_(True), SCHEDULES.c.name.like(f"{RANGE_PREFIX}%"))
        ).scalars().all()
    return [job_of_schedule(name) for name in names]


def repair_inactive(sessions: sessionmaker[Session], jobs: list[RangeJob]) -> list[str]:
    """Reactivate each of `jobs` whose run is live while the job is not reconciled (a control
    that failed between its two steps in an older version, or a schedule row edited by hand):
    such a run would otherwise wait forever. Returns the jobs it reactivated."""
    active = set(active_jobs(sessions))
    repaired = []
    for job in jobs:
        if job.name in active:
            continue
        run = current_run(sessions, job.name)
        if run is not None and run.state in RunState.LIVE:
            with sessions.begin() as session:
                _schedule_on(session, job.name)
            log.warning("reconcile %s: run %d is %s but the job was not reconciled; "
                        "reconciling it again", job.name, run.id, run.state)
            repaired.append(job.name)
    return repaired
