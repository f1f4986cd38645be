"""The closing round: when a run of a range job may end (README, "Which rows a run processes").

A partition is done once its keyset pass reached `hi`, but a row can still come to match below
its checkpoint: an id allocated before its transaction began (a PostgreSQL sequence with a
cache, hi-lo or pooled id blocks, application-assigned ids) commits whenever its transaction
does. So a run never ends on id arithmetic. Once every partition of
the run is finished, a reconcile round begins a closing round:

    t0  every partition is done or empty; the round notes their fences and the time
    t1  one read of the job's table with the job's filter (rows still to do, the skip
        policy's quarantined rows left out), taken after t0
    t2  rows found    -> the partitions holding them go back to pending, their keyset pass
                         to start again from `lo`; the run goes on, and once they are
                         finished again the next closing round begins
        none found    -> in one transaction, if no partition changed since t0 (the same
                         fences, all still finished, none added), the run succeeds

so a run that says `succeeded` processed, exactly once, every row that matched the job's
filter and was committed before its closing round began, whatever the id scheme (cached
sequences, id blocks, application ids, deleted, sparse or empty id ranges). `succeeded` is
terminal: the job is no longer reconciled, and rows that come to match later belong to the
next run (`start`).

A job declared with `follow=True` follows its table instead: where its run would succeed it
becomes `following`, stays live, and the closing read repeats every `settle` seconds
(RANGE_SETTLE), reopening the partitions of rows that came to match, until it is cancelled. A
job reconciled without a run (activated directly) is followed the same way.

A keyed job (tasks.ranges.jobkeys) reads the same, and the database says which partition
holds each row found (a CASE over the partitions' upper keys, in its own ordering), since
Python cannot order keys as the database does (a string's collation).

Cost: the partition bounds of the job (one read) and
`SELECT id FROM <table> WHERE <filter> LIMIT n` (n = CLOSING_LIMIT plus the quarantined rows):
a scan of the rows still to do, through an index on the filter if the table has one, else
of the table. A job of two or more partitions reads it as two statements at once on two
connections, split at the middle partition's upper bound (`id <= cut`, `id > cut`): an
unindexed scan, on the run's critical path, then takes both cores of the worker's machine
(SQLite's driver lets go of the GIL while a statement runs) or two server processes. Both
begin after t0, so what they find is what one read would.
"""

from __future__ import annotations

import bisect
import contextvars
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    bindparam,
    case,
    exists,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.jobs import RangeJob
from tasks.ranges.keys import range_schedule_name
from tasks.ranges.runs import (
    RECONCILER,
    Run,
    change_state,
    current_run,
    record,
    statuses,
    writing,
)
from tasks.ranges.skips import quarantined_of_job
from tasks.ranges.tables import SCHEDULES, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.visits import is_planned
from tasks.ranges.workrow import RANGE_KIND, partitions_of
from tasks.store.db import affected, pooled, utcnow
from tasks.store.validate import InvalidArguments

__all__ = ["Closing", "close_run", "closing_read", "keyed_closing_read", "CLOSING_LIMIT",
           "nothing_open"]

log = logging.getLogger("tasks.ranges")

CLOSING_LIMIT = 1000  # rows one closing read looks for (each reopens its partition)

# Is a partition of the job paused, and is one open? (Two index probes in one statement:
# `ix_work_items_job_status_part`.)
_OF_JOB = and_(WORK.c.kind == RANGE_KIND, WORK.c.job == bindparam("any_job"))
_ANY = select(exists().where(_OF_JOB, WORK.c.status == S.PAUSED),
              exists().where(_OF_JOB, WORK.c.status.in_(S.OPEN)))

# The round's term check, the first statement of its write transaction (False: overtaken).
Hold = Callable[[Session], bool]


@dataclass
class Closing:
    """What the end of a reconcile round did: the closing read and the run's new state."""

    found: int = 0  # rows still to do that the closing read found
    reopened: list[int] = field(default_factory=list)  # partitions set back to pending
    seconds: float | None = None  # how long the closing read took (None: no closing read)
    run: str | None = None  # the state the run moved to
    overtaken: bool = False


@dataclass(frozen=True)
class _Snapshot:
    """The job's partitions when the closing round began: bounds, and what may not change."""

    parts: list[Any]  # (part, lo, hi, hi_key) ordered by lo
    finished: int
    fences: int


def nothing_open(sessions: sessionmaker[Session], job: str) -> bool:
    """No partition of `job` is pending, running or paused (its closing round may begin)."""
    with sessions() as session:
        return session.execute(select(WORK.c.part).where(
            partitions_of(job),
            WORK.c.status.in_((*S.OPEN, S.PAUSED))).limit(1)).first() is None


def closing_read(sessions: sessionmaker[Session], job: RangeJob, params: Any = None,
                 cut: int | None = None) -> list[int]:
    """Ids of rows of `job` still to do (its filter for the run's parameters `params`),
    quarantined rows left out: up to CLOSING_LIMIT of them, or, split at the id `cut`, up to
    CLOSING_LIMIT on each side, the two sides read at once on two connections (a scan of a
    table without an index on the filter then takes both cores, or two server processes)."""
    with sessions() as session:
        quarantined = quarantined_of_job(session, job.name) if job.skip_on else frozenset()
    query = (select(job.id_col).where(job.filter(params))
             .limit(CLOSING_LIMIT + len(quarantined)))

    own = pooled(sessions)  # the two sides each on a connection of their own

    def read(one: Select[Any]) -> list[int]:
        with own() as session:
            return [int(i) for i in session.execute(one).scalars()]

    if cut is None:
        ids = read(query)
    else:
        sides = (query.where(job.id_col <= cut), query.where(job.id_col > cut))
        with ThreadPoolExecutor(len(sides), thread_name_prefix="closing") as pool:
            # Each side in a copy of this context (log fields, the round's trace).
            found = [pool.submit(contextvars.copy_context().run, read, side) for side in sides]
            ids = [i for side in found for i in side.result()]
    return [i for i in ids if i not in quarantined]


def _cut(sessions: sessionmaker[Session], parts: list[Any]) -> int | None:
    """Where a closing read splits in two: the upper bound of the first half of the
    partitions (ordered by `lo`). None, one read: fewer than two partitions, or a database
    each connection of which is a database of its own (SQLite in memory)."""
    if len(parts) < 2 or not _shared(sessions):
        return None
    return int(parts[len(parts) // 2 - 1][2])


def _shared(sessions: sessionmaker[Session]) -> bool:
    bind = pooled(sessions).kw.get("bind")
    url = getattr(bind, "url", None)
    if url is None:
        return False
    if url.get_backend_name() != "sqlite":
        return True
    database = url.database or ""
    return database not in ("", ":memory:") and "mode=memory" not in str(url)


def close_run(sessions: sessionmaker[Session], job: RangeJob, hold: Hold, *,
              settle: float, clock: Callable[[], float] = time.monotonic) -> Closing:
    """The end of a reconcile round: a run whose partitions all finished ends (failed if one
    failed) or gets its closing round; paused partitions of a running run (a pause that lost
    a race with resume) go back to pending."""
    result = Closing()
    run = current_run(sessions, job.name, counted=False)  # an end adds the rows up itself
    state = run.state if run is not None else None
    if state not in (None, RunState.RUNNING, RunState.FOLLOWING):
        return result
    counts = _statuses_after_resume_race(sessions, job.name, state)
    if counts is None or any(counts.get(s, 0) for s in (*S.OPEN, S.PAUSED)):
        return result
    if counts.get(S.FAILED) or job.visits_once:
        _end_without_read(sessions, job, run, counts, hold, result)
        return result
    if state != RunState.RUNNING and not _due(sessions, job.name, settle):
        return result
    try:
        params = job.params_of(run.params if run is not None else None)
    except InvalidArguments as exc:  # reconciled without a run, and no defaults to build on
        log.warning("range %s: no closing read: %s", job.name, exc)
        return result
    snapshot, began = _snapshot(sessions, job.name), utcnow()
    started = clock()
    result.found, holding = _found(sessions, job, params, snapshot)
    result.seconds = clock() - started
    with writing(sessions) as session:
        if not hold(session):
            result.overtaken = True
            return result
        session.execute(update(SCHEDULES).where(
            SCHEDULES.c.name == range_schedule_name(job.name)).values(closed_at=began))
        if result.found:
            result.reopened = _reopen(session, job.name, holding)
        elif run is not None and state == RunState.RUNNING and _unchanged(session, job.name,
                                                                          snapshot):
            to = RunState.FOLLOWING if job.follow else RunState.SUCCEEDED
            detail = (f"closing round began {began.isoformat(timespec='milliseconds')}Z, read "
                      f"the filter over {len(snapshot.parts)} partitions in "
                      f"{result.seconds:.3f}s, found nothing")
            result.run = _change(session, run, to, detail)
    if result.found:
        log.info("range %s: the closing read found %d rows still to do; partitions %s go "
                 "back to pending", job.name, result.found, result.reopened[:20])
    return result


def _end_without_read(sessions: sessionmaker[Session], job: RangeJob, run: Run | None,
                      counts: dict[str, int], hold: Hold, result: Closing) -> None:
    """A run with a failed partition fails; a visit-once run (`tasks.ranges.visits`) has no
    closing read: it succeeds once its plan is made and every partition of it is done (its
    cursor reached its upper bound) or empty."""
    if run is None:
        return
    if counts.get(S.FAILED):
        result.run = _end(sessions, run, RunState.FAILED, _summary(counts))
        return
    if run.state != RunState.RUNNING:
        return
    with writing(sessions) as session:
        if not hold(session):
            result.overtaken = True
            return
        counts = statuses(session, run.job)
        if not is_planned(session, run.id) or set(counts) - {S.DONE, S.EMPTY}:
            return
        result.run = _change(session, run, RunState.SUCCEEDED,
                             f"every partition of the plan reached its upper bound "
                             f"({sum(counts.values())} partitions); visits once, so no "
                             "closing read")


def _statuses_after_resume_race(sessions: sessionmaker[Session], job: str,
                                state: str | None) -> dict[str, int] | None:
    """The job's partitions counted by state, or None while one is open or paused (the
    round's usual case: two index probes, no count of the plan and no write transaction).
    A running run's paused partitions (a pause that lost a race with resume) go back to
    pending, and are open then."""
    with sessions() as session:
        paused, still_open = session.execute(_ANY, {"any_job": job}).one()
        if not paused:
            return None if still_open else statuses(session, job)
    if state != RunState.RUNNING:
        return None
    with writing(sessions) as session:
        moved = affected(session.execute(update(WORK).where(
            partitions_of(job), WORK.c.status == S.PAUSED)
            .values(status=S.PENDING, dispatched_at=None)))
        return None if moved else statuses(session, job)


def _summary(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def _due(sessions: sessionmaker[Session], job: str, settle: float) -> bool:
    """A followed job's closing read repeats every `settle` seconds."""
    with sessions() as session:
        closed: datetime | None = session.execute(select(SCHEDULES.c.closed_at).where(
            SCHEDULES.c.name == range_schedule_name(job))).scalar()
    return closed is None or closed <= utcnow() - timedelta(seconds=settle)


def _snapshot(sessions: sessionmaker[Session], job: str) -> _Snapshot:
    with sessions() as session:
        rows = session.execute(select(WORK.c.part, WORK.c.lo, WORK.c.hi, WORK.c.fence,
                                      WORK.c.hi_key).where(
            partitions_of(job)).order_by(WORK.c.lo)).all()
    return _Snapshot([(r.part, r.lo, r.hi, r.hi_key) for r in rows], len(rows),
                     sum(int(r.fence) for r in rows))


def _unchanged(session: Session, job: str, snapshot: _Snapshot) -> bool:
    """Every partition of the snapshot is still finished under the same fence, none added."""
    finished_now = case((WORK.c.status.in_((S.DONE, S.EMPTY)), 1), else_=0)
    total, finished, fences = session.execute(select(
        func.count(), func.coalesce(func.sum(finished_now), 0),
        func.coalesce(func.sum(WORK.c.fence), 0)).where(
        partitions_of(job))).one()
    return (int(total), int(finished), int(fences)) == (
        snapshot.finished, snapshot.finished, snapshot.fences)


def _found(sessions: sessionmaker[Session], job: RangeJob, params: Any,
           snapshot: _Snapshot) -> tuple[int, set[int]]:
    """The closing read: how many rows still to do it found, and the partitions holding
    them. A row outside every partition (committed after this round planned) is planned by
    the next round."""
    if job.keyed:
        with sessions() as session:
            parts = keyed_closing_read(session, job, params, snapshot.parts)
        return len(parts), {p for p in parts if p is not None}
    found = closing_read(sessions, job, params, _cut(sessions, snapshot.parts))
    los = [lo for _part, lo, _hi, _key in snapshot.parts]
    holding = set()
    for row_id in found:
        at = bisect.bisect_right(los, row_id) - 1
        if at >= 0 and row_id <= snapshot.parts[at][2]:
            holding.add(snapshot.parts[at][0])
    return len(found), holding


def keyed_closing_read(session: Session, job: RangeJob, params: Any,
                       parts: list[Any]) -> list[int | None]:
    """For up to CLOSING_LIMIT rows of a keyed job still to do, the partition holding each
    (None: the job has no partition yet). Partitions of a keyed plan are numbered in key
    order, each up to its `hi_key` (the last one unbounded)."""
    key, dialect = job.keyset, session.get_bind().dialect.name
    ordered = sorted(parts)
    part_of: ColumnElement[Any] = literal(None)
    if ordered:
        whens = [(key.at_most(dialect, key.literal(key.decode(hi_key) or ())), part)
                 for part, _lo, _hi, hi_key in ordered[:-1]]
        part_of = case(*whens, else_=ordered[-1][0]) if whens else literal(ordered[-1][0])
    query = select(part_of).where(job.filter(params)).limit(CLOSING_LIMIT)
    return [None if p is None else int(p) for p in session.execute(query).scalars()]


def _reopen(session: Session, job: str, holding: set[int]) -> list[int]:
    """The finished partitions in `holding` go back to pending, their checkpoint back at
    `lo` (a keyed job's cursor at `lo_key`): the rows found lie below it."""
    if not holding:
        return []
    parts = sorted(holding)
    session.execute(update(WORK).where(
        partitions_of(job), WORK.c.part.in_(parts),
        WORK.c.status.in_((S.DONE, S.EMPTY)))
        .values(status=S.PENDING, next_id=WORK.c.lo, next_key=WORK.c.lo_key, finished_at=None,
                dispatched_at=None))
    return parts


def _end(sessions: sessionmaker[Session], run: Run, to: str, detail: str) -> str | None:
    with writing(sessions) as session:
        return _change(session, run, to, detail)


def _change(session: Session, run: Run, to: str, detail: str) -> str | None:
    """The run moves to `to` (compare-and-set); an ended run's job stops being reconciled."""
    if not change_state(session, run, to):
        return None
    record(session, run.id, run.job, to, RECONCILER, detail)
    if to in RunState.ENDED:
        session.execute(update(SCHEDULES).where(
            SCHEDULES.c.name == range_schedule_name(run.job)).values(active=False))
    return to
