"""The reconciler (seed 002's dispatcher): plans partitions and dispatches unleased ones.

One round per job at a time: a round runs only after it wins a term compare-and-set on the
job's schedule row and the row's `next_run_at` has passed, so two beats (or a beat and an ad-hoc
`start`) never run the same round twice. Failover after a crash therefore takes at most the
lease TTL plus one reconcile interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import redis
from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from lease.keys import lease_key
from tasks.jobs import RangeJob
from tasks.models import SCHEDULES, WORK, affected, utcnow
from tasks.models import PartitionStatus as S
from tasks.planning import plan_partitions

__all__ = ["Round", "schedule_name", "activate", "reconcile_job", "active_jobs"]

log = logging.getLogger("tasks.ranges")


Dispatch = Callable[[str, int], None]


def schedule_name(job: str) -> str:
    return f"range:{job}"


@dataclass
class Round:
    """What one reconcile round did."""

    job: str
    ran: bool
    planned: int = 0
    reopened: int = 0
    dispatched: list[int] = field(default_factory=list)


def activate(sessions: sessionmaker[Session], job: RangeJob) -> int:
    """Mark `job` active (beat reconciles it from now on); reset its failed partitions.

    Returns how many failed partitions go back to pending.
    """
    name = schedule_name(job.name)
    now = utcnow()
    with sessions.begin() as session:
        updated = affected(session.execute(update(SCHEDULES).where(SCHEDULES.c.name == name)
                                           .values(active=True, next_run_at=now, updated_at=now)))
        if not updated:
            session.execute(insert(SCHEDULES).values(
                name=name, term=0, next_run_at=now, active=True, updated_at=now))
        return affected(session.execute(
            update(WORK).where(WORK.c.kind == "range", WORK.c.job == job.name,
                               WORK.c.status == S.FAILED)
            .values(status=S.PENDING, error=None, dispatched_at=None)
        ))


def active_jobs(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        names = session.execute(select(SCHEDULES.c.name).where(
            SCHEDULES.c.active.is_(True), SCHEDULES.c.name.like("range:%"))).scalars().all()
    return [name.split(":", 1)[1] for name in names]


def _win_round(session: Session, name: str, interval: float) -> bool:
    """One compare-and-set: the round is ours if it was due and nobody took it first."""
    now = utcnow()
    # Half an interval, so beat's jitter never skips a round, yet no round runs twice.
    return affected(session.execute(
        update(SCHEDULES).where(SCHEDULES.c.name == name, SCHEDULES.c.next_run_at <= now)
        .values(term=SCHEDULES.c.term + 1, next_run_at=now + timedelta(seconds=interval / 2),
                updated_at=now)
    )) == 1


def reconcile_job(
    sessions: sessionmaker[Session],
    client: redis.Redis,
    job: RangeJob,
    dispatch: Dispatch,
    *,
    interval: float,
    grace: float,
) -> Round:
    """One reconcile round for `job`: plan, reopen grown partitions, dispatch unleased ones.

    A partition is dispatched when it is open (pending or running), nobody holds its lease, and
    it was not dispatched within `grace` seconds (a queued message may still be on its way).
    """
    with sessions.begin() as session:
        if not _win_round(session, schedule_name(job.name), interval):
            return Round(job.name, ran=False)
    result = Round(job.name, ran=True)
    with sessions() as session:
        lo, hi = session.execute(select(func.min(job.id_col), func.max(job.id_col))).one()
        known = set(session.execute(select(WORK.c.part).where(
            WORK.c.kind == "range", WORK.c.job == job.name)).scalars())
    missing = [p for p in plan_partitions(lo, hi, job.partition_size) if p.part not in known]
    with sessions.begin() as session:
        if missing:  # one round at a time, so nobody else inserts these rows meanwhile
            session.execute(insert(WORK), [
                {"kind": "range", "job": job.name, "part": p.part, "lo": p.lo, "hi": p.hi,
                 "next_id": p.lo, "fence": 0, "status": S.PENDING, "claims": 0, "rows_done": 0,
                 "rate": 0.0} for p in missing])
        result.planned = len(missing)
        if hi is not None:
            result.reopened = _reopen(session, job, hi)
    result.dispatched = _dispatch_unleased(sessions, client, job, dispatch, grace)
    if result.planned or result.reopened or result.dispatched:
        log.info("reconcile %s: planned %d, reopened %d, dispatched %s", job.name,
                 result.planned, result.reopened, result.dispatched)
    return result


def _reopen(session: Session, job: RangeJob, max_id: int) -> int:
    """Rows appended after a partition finished: set it back to pending, from its checkpoint."""
    return affected(session.execute(
        update(WORK).where(WORK.c.kind == "range", WORK.c.job == job.name,
                           WORK.c.status.in_((S.DONE, S.EMPTY)), WORK.c.next_id <= max_id,
                           WORK.c.next_id <= WORK.c.hi)
        .values(status=S.PENDING, finished_at=None, dispatched_at=None)
    ))


def _dispatch_unleased(sessions: sessionmaker[Session], client: redis.Redis, job: RangeJob,
                       dispatch: Dispatch, grace: float) -> list[int]:
    cutoff = utcnow() - timedelta(seconds=grace)
    with sessions() as session:
        open_parts = session.execute(select(WORK.c.part, WORK.c.dispatched_at).where(
            WORK.c.kind == "range", WORK.c.job == job.name, WORK.c.status.in_(S.OPEN)
        ).order_by(WORK.c.part)).all()
    candidates = [r.part for r in open_parts if r.dispatched_at is None or r.dispatched_at < cutoff]
    if not candidates:
        return []
    with client.pipeline(transaction=False) as pipe:
        for part in candidates:
            pipe.exists(lease_key(job.lease_name(part)))
        held = pipe.execute()
    unleased = [part for part, h in zip(candidates, held, strict=True) if not h]
    if not unleased:
        return []
    with sessions.begin() as session:
        session.execute(update(WORK).where(WORK.c.kind == "range", WORK.c.job == job.name,
                                           WORK.c.part.in_(unleased))
                        .values(dispatched_at=utcnow()))
    for part in unleased:
        dispatch(job.name, part)
    return unleased
