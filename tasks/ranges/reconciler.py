"""The reconciler (the design's dispatcher): plans partitions and dispatches unleased ones.

One round per job at a time, by a term compare-and-set on the job's schedule row: a round reads
the row's `term` and wins only with `UPDATE ... SET term = :seen + 1 WHERE term = :seen` (and
the row's `next_run_at` has passed). Every write transaction of the round then begins with
`UPDATE ... WHERE term = :mine`, so a round overtaken by a newer one (an ad-hoc `start` resets
`next_run_at`, a second beat) writes nothing: exactly one round plans a partition and
dispatches it. On PostgreSQL and MariaDB that first UPDATE also row-locks the schedule row,
so a newer round's compare-and-set waits for an in-flight write of the older one.

    t0  round A wins term 7, reads the id bounds and the stored plan
    t1  `start` resets next_run_at; round B wins term 8, reads, plans partitions 3..5
    t2  A's planning transaction: `UPDATE schedules ... WHERE term = 7` matches nothing,
        so A stops; it neither plans (no IntegrityError) nor dispatches

Failover after a crash therefore takes at most the lease TTL plus one reconcile interval.

Dispatch is pull-based when the round is given `runners` (the worker's rounds always are):
the round sends a runner message ("run partitions of job J", `tasks.ranges.pull`) only while
fewer than the job's bound (RANGE_RUNNERS) are outstanding and pending partitions exist, and
dispatches by partition only the running partitions nobody holds (their holder died; the
job's running holders may adopt them first, `tasks.ranges.gate`). A round so reads the
running partitions (as many as the fleet runs) and at most `bound` pending ones, never the
whole plan, and the messages in flight follow the fleet, not the backlog. Without `runners`
(an in-process driver that runs what it is handed, as the tests do) every open partition
nobody holds is dispatched.

Controls: a round first reads the job's run (`runs.enforce`) and copies its state and
throttle to Redis, so a flushed Redis cannot un-pause a job; a paused or cancelled job's round
dispatches nothing, and an ended run's round does nothing. A round that ran ends with
`closing.close_run`: once every partition finished, the closing round decides whether the run
succeeds (or fails, if a partition failed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import redis
from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from lease.keys import lease_key
from tasks.ranges.activation import activate, activate_in, active_jobs, due_now, repair_inactive
from tasks.ranges.closing import close_run
from tasks.ranges.collections import COLLECTION_PARTITION
from tasks.ranges.cuts import plan_first_by_rows
from tasks.ranges.jobs import RangeJob
from tasks.ranges.keys import range_orphans_key
from tasks.ranges.keys import range_schedule_name as schedule_name
from tasks.ranges.planning import Partition, StoredPlan, plan_after
from tasks.ranges.runners import RunnerSlots, new_token
from tasks.ranges.runs import enforce
from tasks.ranges.tables import SCHEDULES, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.visits import mark_planned, plan_once, unplanned_run
from tasks.ranges.workrow import RANGE_KIND, partitions_of
from tasks.store.db import affected, insert_many, utcnow

__all__ = ["Round", "Runners", "Shared", "schedule_name", "activate", "activate_in",
           "reconcile_job", "active_jobs", "repair_inactive", "due_now"]

log = logging.getLogger("tasks.ranges")


Dispatch = Callable[[str, int], None]
# Sends one runner message of a job (job, runner token).
Spawn = Callable[[str, str], None]
# A test seam: called with the name of each step of a round ("won", "read") as it passes it.
Seam = Callable[[str], None]
# Tables' id bounds by (table, id column): `Shared.bounds`.
Bounds = dict[tuple[str, str], tuple[Any, Any]]


@dataclass
class Round:
    """What one reconcile round did."""

    job: str
    ran: bool
    planned: int = 0
    # Partitions the closing read set back to pending, and the rows still to do it found.
    reopened: int = 0
    late: int = 0
    dispatched: list[int] = field(default_factory=list)
    closing_s: float | None = None  # how long the closing read took (None: none this round)
    overtaken: bool = False  # a newer round won the term while this one ran: it stopped
    held: str | None = None  # the run is paused, cancelled or ended: the round did nothing
    run: str | None = None  # the state the round moved the job's run to (succeeded, ...)
    runners: int = 0  # runner messages sent (pull-based dispatch)


@dataclass
class Shared:
    """What the rounds of one reconcile (every active job's, one after another) read once.

    - Each table's id bounds, by (table, id column), as the first job over it read them. A
      bound read a moment before another job's round only plans that job's newest ids a
      round later; the closing read finds rows beyond every partition whatever the bounds
      said.
    - The schedule rows (term, next_run_at) of the jobs `names`, in one read. A row read a
      moment early only loses its compare-and-set (another round won the term meanwhile: this
      one does nothing) or skips a round that became due meanwhile until the next reconcile.
    """

    names: list[str]
    bounds: dict[tuple[str, str], tuple[Any, Any]] = field(default_factory=dict)
    schedules: dict[str, Any] | None = None

    def schedule(self, sessions: sessionmaker[Session], name: str) -> Any:
        """Schedule row `name`'s term and next_run_at (None: no such row)."""
        wanted = [schedule_name(job) for job in self.names]
        if name not in wanted:  # a round of a job outside the reconcile: its own read
            with sessions() as session:
                return session.execute(_SCHEDULES, {"names": [name]}).first()
        if self.schedules is None:
            with sessions() as session:
                self.schedules = {row.name: row for row in session.execute(
                    _SCHEDULES, {"names": wanted})}
        return self.schedules.get(name)


_SCHEDULES = select(SCHEDULES.c.name, SCHEDULES.c.term, SCHEDULES.c.next_run_at).where(
    SCHEDULES.c.name.in_(bindparam("names", expanding=True)))


@dataclass(frozen=True)
class Runners:
    """Pull-based dispatch: the job's outstanding runner messages and how to send one."""

    slots: RunnerSlots
    spawn: Spawn


def _win_round(sessions: sessionmaker[Session], name: str, interval: float,
               shared: Shared | None = None) -> int | None:
    """The term compare-and-set: the new term if the round was due and nobody took it first."""
    now = utcnow()
    row = (shared or Shared([])).schedule(sessions, name)
    if row is None or row.next_run_at > now:
        return None
    with sessions.begin() as session:
        # Half an interval, so beat's jitter never skips a round.
        won = affected(session.execute(
            update(SCHEDULES).where(SCHEDULES.c.name == name, SCHEDULES.c.term == row.term)
            .values(term=row.term + 1, next_run_at=now + timedelta(seconds=interval / 2),
                    updated_at=now)))
    return row.term + 1 if won == 1 else None


def _hold(session: Session, name: str, term: int) -> bool:
    """The first statement of each write transaction of a round: is `term` still the newest?"""
    return affected(session.execute(
        update(SCHEDULES).where(SCHEDULES.c.name == name, SCHEDULES.c.term == term)
        .values(updated_at=utcnow()))) == 1


def reconcile_job(
    sessions: sessionmaker[Session],
    client: redis.Redis,
    job: RangeJob,
    dispatch: Dispatch,
    *,
    interval: float,
    grace: float,
    settle: float = 60.0,
    seam: Seam | None = None,
    runners: Runners | None = None,
    shared: Shared | None = None,
) -> Round:
    """One reconcile round for `job`: plan, dispatch unleased partitions, and once every
    partition finished, the closing round (`tasks.ranges.closing`).

    A partition is dispatched when it is open (pending or running; with `runners`: running
    only), nobody holds its lease, and it was not dispatched within `grace` seconds (a queued
    message may still be on its way). With `runners`, runner messages top the job's
    outstanding ones up to their bound while pending partitions exist. A followed job's
    closing read repeats every `settle` seconds. `shared`: what the rounds of several jobs
    read once (`Shared`)
    """
    state = enforce(sessions, client, job.name)
    if state in (RunState.PAUSED, RunState.CANCELLED, RunState.SUCCEEDED, RunState.FAILED):
        return Round(job.name, ran=False, held=state)
    term = _win_round(sessions, schedule_name(job.name), interval, shared)
    if term is None:
        return Round(job.name, ran=False)
    step = seam or (lambda _step: None)
    step("won")
    result = Round(job.name, ran=True)
    bounds = shared.bounds if shared is not None else None
    if not _plan(sessions, job, term, result, step, bounds):
        return _overtaken(result)
    # The closing round before dispatching: the partitions it reopens go out at once.
    closing = close_run(sessions, job, lambda s: _hold(s, schedule_name(job.name), term),
                        settle=settle)
    if closing.overtaken:
        return _overtaken(result)
    result.reopened, result.late = len(closing.reopened), closing.found
    result.closing_s, result.run = closing.seconds, closing.run
    statuses = S.OPEN if runners is None else (S.RUNNING,)
    dispatched = _dispatch_unleased(sessions, client, job, term, dispatch, grace, statuses)
    if dispatched is None or (runners is not None
                              and not _top_up(sessions, job.name, term, runners, result)):
        return _overtaken(result)
    result.dispatched = dispatched
    _log(result)
    return result


def _log(result: Round) -> None:
    if result.planned or result.reopened or result.dispatched or result.run or result.runners:
        log.info("reconcile %s: planned %d, dispatched %s, sent %d runners, closing read "
                 "found %d rows (reopened %d partitions), run %s", result.job, result.planned,
                 result.dispatched[:20], result.runners, result.late, result.reopened,
                 result.run or "-")


def _plan(sessions: sessionmaker[Session], job: RangeJob, term: int, result: Round,
          step: Seam, bounds: Bounds | None = None) -> bool:
    """Add the partitions the table needs; False if the round was overtaken (then it wrote
    nothing)."""
    if job.visits_once:
        return _plan_once(sessions, job, term, result, step)
    with sessions() as session:
        plan = session.execute(select(func.min(WORK.c.lo), func.max(WORK.c.hi),
                                      func.max(WORK.c.part)).where(
            partitions_of(job.name))).one()
        stored = StoredPlan(*plan) if plan[2] is not None else None
        missing = _missing(session, job, stored, bounds)
    step("read")
    if not missing:  # nothing to write (the round's later writes check its term)
        return True
    with sessions.begin() as session:
        if not _hold(session, schedule_name(job.name), term):
            return False
        _insert(session, job, missing)
        result.planned = len(missing)
    return True


def _bounds(session: Session, job: RangeJob, run: int | None = None,
            shared: Bounds | None = None) -> tuple[Any, Any]:
    """The lowest and highest id of the job's table (of run `run`'s input, for a CSV job);
    a whole table's, from `shared` when another job's round of this reconcile read them."""
    key = (job.id_col.table.fullname, job.id_col.key) if job.run_scope(run) is None else None
    if shared is not None and key is not None:
        if key not in shared:
            shared[key] = _bounds(session, job, run)
        return shared[key]
    # Two scalar subqueries, not min() and max() in one select: SQLite answers a lone
    # min() or max() from the index but scans the table for both together (60 ms at
    # 1,000,000 rows). Still one statement, so one snapshot.
    low, high = select(func.min(job.id_col)), select(func.max(job.id_col))
    scope = job.run_scope(run)
    if scope is not None:
        low, high = low.where(scope), high.where(scope)
    lo, hi = session.execute(select(low.scalar_subquery(), high.scalar_subquery())).one()
    return lo, hi


def _insert(session: Session, job: RangeJob, parts: list[Partition]) -> None:
    """Store `parts` as pending partitions of `job` (in the round's transaction)."""
    if not parts:
        return
    # A re-planned job's partitions start at the old plan's highest fence.
    floor = session.execute(select(SCHEDULES.c.fence_floor).where(
        SCHEDULES.c.name == schedule_name(job.name))).scalar() or 0
    key = job.keyset  # a keyed job's bounds and cursor (tasks.ranges.jobkeys)
    insert_many(session, WORK, [
        {"kind": RANGE_KIND, "job": job.name, "part": p.part, "lo": p.lo, "hi": p.hi,
         "next_id": p.lo, "fence": floor, "status": S.PENDING, "claims": 0,
         "rows_done": 0, "rate": 0.0, "crashes": 0, "lo_key": key.encode(p.lo_key),
         "hi_key": key.encode(p.hi_key), "next_key": key.encode(p.lo_key)} for p in parts])


def _plan_once(sessions: sessionmaker[Session], job: RangeJob, term: int, result: Round,
               step: Seam) -> bool:
    """A visit-once job's plan (`tasks.ranges.visits`): made once per run, from one bounds
    read, by the first round of the run; later rounds add nothing (rows inserted above the
    plan's upper bound belong to the next run)."""
    began = utcnow()
    with sessions() as session:
        run = unplanned_run(session, job.name)
        if run is None:
            return True
        lo, hi = _bounds(session, job, run) if job.pages is None else (None, None)
    step("read")
    # A custom collection is one partition, whose place is its cursor.
    parts = [COLLECTION_PARTITION] if job.pages is not None else plan_once(
        lo, hi, job.partition_size)
    with sessions.begin() as session:
        if not _hold(session, schedule_name(job.name), term):
            return False
        if mark_planned(session, run, began):
            _insert(session, job, parts)
            result.planned = len(parts)
    return True


def _missing(session: Session, job: RangeJob, stored: StoredPlan | None,
             bounds: Bounds | None = None) -> list[Partition]:
    """The partitions to add: a first plan cut by rows (tasks.ranges.cuts), none for a keyed
    plan (it covers every key), else id-span partitions for ids beyond the stored plan."""
    if job.by_rows and stored is None:
        return plan_first_by_rows(session, job)
    if job.keyed:
        return []
    lo, hi = _bounds(session, job, shared=bounds)
    return plan_after(stored, lo, hi, job.partition_size)


def _overtaken(result: Round) -> Round:
    log.info("reconcile %s: a newer round took over; this one stops", result.job)
    result.overtaken = True
    return result


def _top_up(sessions: sessionmaker[Session], job: str, term: int, runners: Runners,
            result: Round) -> bool:
    """Send runner messages while fewer than the bound are outstanding and pending
    partitions exist (no more than there are); False if the round was overtaken."""
    free = runners.slots.bound - runners.slots.outstanding()
    if free <= 0:
        return True
    with sessions() as session:
        pending = len(session.execute(select(WORK.c.part).where(
            partitions_of(job), WORK.c.status == S.PENDING).limit(free)).all())
    if not pending:
        return True
    tokens = [new_token() for _ in range(pending)]
    with sessions.begin() as session:
        if not _hold(session, schedule_name(job), term):
            return False
    runners.slots.sent(tokens)
    for token in tokens:
        runners.spawn(job, token)
    result.runners = len(tokens)
    return True


def _dispatch_unleased(sessions: sessionmaker[Session], client: redis.Redis, job: RangeJob,
                       term: int, dispatch: Dispatch, grace: float,
                       statuses: tuple[str, ...] = S.OPEN) -> list[int] | None:
    """Dispatch partitions in `statuses` nobody holds; None if the round was overtaken."""
    cutoff = utcnow() - timedelta(seconds=grace)
    with sessions() as session:
        open_parts = session.execute(select(WORK.c.part, WORK.c.dispatched_at, WORK.c.status)
                                     .where(partitions_of(job.name),
                                            WORK.c.status.in_(statuses))
                                     .order_by(WORK.c.part)).all()
    candidates = [r.part for r in open_parts if r.dispatched_at is None or r.dispatched_at < cutoff]
    if not candidates:
        return []
    with client.pipeline(transaction=False) as pipe:
        for part in candidates:
            pipe.exists(lease_key(job.lease_name(part)))
        held = pipe.execute()
    unleased = [part for part, h in zip(candidates, held, strict=True) if not h]
    if unleased and statuses == (S.RUNNING,):
        # Read again after the lease check: a holder that finished between the two reads
        # marked its row done before it released the lease, so it is no orphan.
        with sessions() as session:
            unleased = sorted(session.execute(select(WORK.c.part).where(
                partitions_of(job.name), WORK.c.part.in_(unleased),
                WORK.c.status == S.RUNNING)).scalars())
    if not unleased:
        return []
    with sessions.begin() as session:
        if not _hold(session, schedule_name(job.name), term):
            return None
        session.execute(update(WORK).where(partitions_of(job.name),
                                           WORK.c.part.in_(unleased))
                        .values(dispatched_at=utcnow()))
    for part in unleased:
        dispatch(job.name, part)
    # Running but unleased: the holder died. Offer them to running holders of the job too
    # (tasks.ranges.gate), so they need not wait behind the queued fresh partitions.
    running = {r.part for r in open_parts if r.status == S.RUNNING}
    orphans = [part for part in unleased if part in running]
    if orphans:
        with client.pipeline(transaction=False) as pipe:
            pipe.sadd(range_orphans_key(job.name), *orphans)
            pipe.expire(range_orphans_key(job.name), max(int(2 * grace), 1))
            pipe.execute()
    return unleased
