"""A partition's work row: every state change of it, each guarded by the holder's fence.

A holder claims the row with the fencing token of its lease (`claim`: only a higher fence
wins); from then on each of its writes (checkpoint, done, handed back, failed) is an
`UPDATE work_items ... WHERE fence = :mine AND status = 'running'`, so a holder that a newer
one overtook writes nothing (`FencedOut`).

A batch's own writes are here too, in the batch's transaction: `checkpoint` (its first write,
the guard: it moves the checkpoint and the counts), `move_on` (the checkpoint past the rest of
a batch read `fetch_size` rows at a time), `move_cursor` (a custom collection's guard),
`uncount` (rows a skip policy quarantined), and `park_idle` parks a partition nobody holds,
fenced by the fence it was seen with, and `hand_back_dead` hands back the partitions of a
pool process that died (`tasks.ranges.poolexit`).

Poison partitions: a claim that finds the row still `running` takes over from a holder that
never released it (its process died, or it lost the lease or the database). `crashes` counts
such claims until a batch commits; past the redelivery cap the partition is failed and
dead-lettered instead of run again (`dead_letter`).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Update,
    and_,
    bindparam,
    case,
    func,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletters.store import DeadLetters
from tasks.ranges.failures import record_failure, traceback_of
from tasks.ranges.jobs import RangeJob
from tasks.ranges.outcomes import FencedOut, UnknownPartition
from tasks.ranges.tables import RANGE_RUNS, WORK
from tasks.ranges.tables import PartitionStatus as S
from tasks.store.db import affected, utcnow

__all__ = ["WorkRow", "DEAD_LETTER_KIND", "RANGE_KIND", "partitions_of", "every_partition",
           "park_idle", "hand_back_dead", "restart_finished"]

log = logging.getLogger("tasks.ranges")

# Dead letters of partitions that kept killing their worker.
DEAD_LETTER_KIND = "range-partition"

# `work_items.kind` of a range job's partitions (the table's default; a stored value).
RANGE_KIND = "range"


def every_partition() -> ColumnElement[bool]:
    """The WHERE clause of every range job's partitions in `work_items`."""
    return WORK.c.kind == RANGE_KIND


def partitions_of(job: str) -> ColumnElement[bool]:
    """The WHERE clause of the partitions of range job `job` in `work_items`."""
    return and_(WORK.c.kind == RANGE_KIND, WORK.c.job == job)


# The statements of a partition's run, built once: a run takes several of them, and building
# one costs SQLAlchemy hundreds of microseconds where running it costs tens. The job, the
# partition and the values are bound per call.
_ROW = and_(WORK.c.kind == RANGE_KIND, WORK.c.job == bindparam("row_job"),
            WORK.c.part == bindparam("row_part"))
_LOAD = select(WORK).where(_ROW)
# A row still `running` counts a crash of its holder, unless that holder stopped for an outage
# (its fence is `outage_fence`; NO_OUTAGE, below every fence, when there was none).
NO_OUTAGE = -1
_TOOK_OVER = case((and_(WORK.c.status == S.RUNNING, WORK.c.fence != bindparam("outage_fence")),
                   1), else_=0)
_CLAIM = (
    update(WORK).where(_ROW, WORK.c.fence < bindparam("new_fence"), WORK.c.status.in_(S.OPEN))
    # `crashes` first: MariaDB evaluates SET assignments left to right, so it must read the
    # old status before `status` is assigned.
    .ordered_values(
        (WORK.c.crashes, WORK.c.crashes + _TOOK_OVER), (WORK.c.fence, bindparam("new_fence")),
        (WORK.c.status, S.RUNNING), (WORK.c.owner, bindparam("new_owner")),
        (WORK.c.claims, WORK.c.claims + 1), (WORK.c.started_at, bindparam("claimed_at")),
        (WORK.c.heartbeat_at, bindparam("claimed_at")), (WORK.c.error, None),
        # A claimed row is no longer reserved (tasks.ranges.claims): handed back, it may be
        # claimed again at once.
        (WORK.c.dispatched_at, None)))
# The run the partition belongs to (the id of the job's latest run) with the claimed row.
_LATEST_RUN = (select(func.max(RANGE_RUNS.c.id)).where(RANGE_RUNS.c.job == bindparam("row_job"))
               .scalar_subquery())
_CLAIMED = select(WORK.c.id, WORK.c.lo, WORK.c.hi, WORK.c.next_id, WORK.c.crashes,
                  WORK.c.claims, WORK.c.collection_cursor, _LATEST_RUN.label("run"),
                  WORK.c.lo_key, WORK.c.hi_key, WORK.c.next_key).where(_ROW)
_HELD = and_(_ROW, WORK.c.fence == bindparam("mine"), WORK.c.status == S.RUNNING)
# A batch's guard: the fence and the figures are bound per batch (a keyed job's cursor too,
# tasks.ranges.jobkeys).
_CHECKPOINT_VALUES: dict[str, Any] = {
    "next_id": bindparam("checkpoint"), "rows_done": WORK.c.rows_done + bindparam("batch_rows"),
    "heartbeat_at": bindparam("now"), "rate": bindparam("rows_per_s"), "crashes": 0,
    "throttled_until": None}
_CHECKPOINT = update(WORK).where(_HELD).values(**_CHECKPOINT_VALUES)
_CHECKPOINT_KEYED = update(WORK).where(_HELD).values(**_CHECKPOINT_VALUES,
                                                      next_key=bindparam("key"))
_MOVE_ON = update(WORK).where(_HELD).values(next_id=bindparam("checkpoint"),
                                             rows_done=WORK.c.rows_done + bindparam("batch_rows"))
_MOVE_ON_KEYED = _MOVE_ON.values(next_key=bindparam("key"))
_FINISH = update(WORK).where(_HELD).values(
    status=case((WORK.c.rows_done > 0, S.DONE), else_=S.EMPTY), owner=None,
    next_id=bindparam("scanned"), finished_at=bindparam("now"), heartbeat_at=bindparam("now"),
    settled_at=None, crashes=0)
_STATUS = select(WORK.c.status).where(_ROW)


class WorkRow:
    """The work row of `job`'s partition `part`, written by the holder called `owner`."""

    def __init__(self, job: RangeJob, part: int, sessions: sessionmaker[Session],
                 owner: str) -> None:
        self.job, self.part = job, part
        self.sessions, self.owner = sessions, owner
        self._row = {"row_job": job.name, "row_part": part}

    @property
    def _where(self) -> tuple[ColumnElement[bool], ...]:
        """The row, for the statements built per call (the run's own are built once)."""
        return partitions_of(self.job.name), WORK.c.part == self.part

    def load(self) -> Any:
        """The row as stored; `UnknownPartition` if the reconciler never planned it."""
        with self.sessions() as session:
            row = session.execute(_LOAD, self._row).first()
        if row is None:
            raise UnknownPartition(f"range job {self.job.name} has no partition {self.part} "
                                   "(not planned yet: start the job first)")
        return row

    def claim(self, fence: int, *, outage_fence: int | None = None) -> Any:
        """Take the open row for the holder of `fence`: its bounds, checkpoint, counts and
        `run` (the id of the job's latest run; None: none), or None if a holder with a newer
        fence claimed it first or it is finished. A row still `running` counts a crash of
        its holder, unless that holder's fence is `outage_fence` (it stopped for a database
        outage and could not say so in the row)."""
        with self.sessions.begin() as session:
            claimed = affected(session.execute(_CLAIM, {
                **self._row, "new_fence": fence, "new_owner": self.owner,
                "claimed_at": utcnow(),
                "outage_fence": NO_OUTAGE if outage_fence is None else outage_fence}))
            if claimed != 1:
                return None
            # The run is read under the claim's row lock: a new run that re-plans the job
            # deletes this row, so it cannot commit in between.
            return session.execute(_CLAIMED, self._row).one()

    def guard(self, fence: int) -> Update:
        """An UPDATE of the row that matches only while the holder of `fence` owns it."""
        return update(WORK).where(*self._where, WORK.c.fence == fence,
                                  WORK.c.status == S.RUNNING)

    def checkpoint(self, conn: Connection, fence: int, checkpoint: int, rows: int,
                   rows_per_s: float, key: str | None = None) -> None:
        """A batch's guard, its first write: the checkpoint moves to `checkpoint` (and a
        keyed job's cursor to `key`, stored form) and `rows` more are counted done, in the
        batch's transaction on `conn`. `FencedOut` (roll the batch back) if the holder of
        `fence` no longer owns the row."""
        values = {**self._row, "mine": fence, "checkpoint": checkpoint, "batch_rows": rows,
                  "now": utcnow(), "rows_per_s": rows_per_s}
        statement = _CHECKPOINT
        if self.job.keyed:
            values["key"], statement = key, _CHECKPOINT_KEYED
        guarded = affected(conn.execute(statement, values))
        if guarded != 1:
            raise FencedOut()

    def move_on(self, conn: Connection, fence: int, checkpoint: int, rows: int,
                key: str | None = None) -> None:
        """The checkpoint moves on to `checkpoint` (a keyed job's cursor to `key`) past `rows`
        more rows read in the same batch (its later `fetch_size` reads). `FencedOut` if a
        newer holder owns the row."""
        values: dict[str, Any] = {**self._row, "mine": fence, "checkpoint": checkpoint,
                                  "batch_rows": rows}
        statement = _MOVE_ON
        if self.job.keyed:
            values["key"], statement = key, _MOVE_ON_KEYED
        moved = affected(conn.execute(statement, values))
        if moved != 1:
            raise FencedOut()

    def move_cursor(self, conn: Connection, fence: int, cursor: str | None, rows: int,
                    rows_per_s: float) -> None:
        """A custom collection's guard (`tasks.ranges.collections`): its cursor moves to
        `cursor` (JSON text) past `rows` more items, in the page's transaction on `conn`.
        `FencedOut` if the holder of `fence` no longer owns the row."""
        moved = affected(conn.execute(self.guard(fence).values(
            collection_cursor=cursor, rows_done=WORK.c.rows_done + rows, heartbeat_at=utcnow(),
            rate=rows_per_s, crashes=0, throttled_until=None)))
        if moved != 1:
            raise FencedOut()

    def uncount(self, conn: Connection, fence: int, rows: int) -> None:
        """`rows` of the batch were quarantined, not processed: they no longer count done,
        they count skipped."""
        conn.execute(self.guard(fence).values(rows_done=WORK.c.rows_done - rows,
                                              rows_skipped=WORK.c.rows_skipped + rows))

    def finish(self, conn: Connection, fence: int, scanned: int) -> str:
        """Mark the row done (or empty when no row was processed), in the transaction of the
        closing read; `scanned` is the checkpoint above every id the run read. Returns the
        final status; `FencedOut` if a newer holder owns the row."""
        done = affected(conn.execute(_FINISH, {**self._row, "mine": fence, "scanned": scanned,
                                               "now": utcnow()}))
        if done != 1:
            raise FencedOut()
        final = conn.execute(_STATUS, self._row).scalar_one()
        log.info("range %s part %s: %s", self.job.name, self.part, final)
        return str(final)

    def release_to_pending(self, fence: int, note: str | None = None) -> None:
        """Hand the row back (the holder stops on purpose); the reconciler dispatches it.
        `note` says why in the row's `error` until the next claim (an outage)."""
        values: dict[str, Any] = {"status": S.PENDING, "owner": None}
        if note is not None:
            values["error"] = note
        with self.sessions.begin() as session:
            session.execute(self.guard(fence).values(**values))

    def park(self, fence: int) -> None:
        """The job was paused or cancelled: the holder stops between batches; the reconciler
        dispatches the row again only after `resume` (or a new run)."""
        with self.sessions.begin() as session:
            session.execute(self.guard(fence).values(status=S.PAUSED, owner=None,
                                                     throttled_until=None))

    def note_throttled(self, fence: int, seconds: float) -> None:
        """Show in the row that its holder waits `seconds` for the job's throttle."""
        with self.sessions.begin() as session:
            session.execute(self.guard(fence).values(
                throttled_until=utcnow() + timedelta(seconds=seconds), heartbeat_at=utcnow()))

    def release_quietly(self, fence: int) -> None:
        """Best effort: a holder that stops without crashing says so (it is no crash)."""
        try:
            self.release_to_pending(fence)
        except (OperationalError, DBAPIError):
            log.warning("range %s part %s: could not hand the partition back; the reconciler "
                        "resumes it", self.job.name, self.part)

    def fail(self, fence: int, exc: BaseException) -> None:
        """Mark the row failed with `exc` as its error (`tasks.ranges.start` resets it), and
        keep the error with its traceback in the run's events, in the same transaction."""
        reason = f"{type(exc).__name__}: {exc}"[:2000]
        try:
            with self.sessions.begin() as session:
                failed = affected(session.execute(self.guard(fence).values(
                    status=S.FAILED, owner=None, error=reason, finished_at=utcnow())))
                if failed:
                    record_failure(session, self.job.name, self.part, self.owner, reason,
                                   traceback_of(exc))
        except Exception:  # the database itself is gone; the lease lapses and it is retried
            log.exception("range %s part %s: could not record the failure", self.job.name,
                          self.part)

    def dead_letter(self, fence: int, claimed: Any, crash_cap: int) -> None:
        """Fail a partition whose holders kept dying, and keep it as a dead letter."""
        reason = (f"its holders died {claimed.crashes} times in a row without committing a "
                  f"batch (REDELIVERY_CAP={crash_cap}): the partition keeps killing its "
                  "worker; fix it, then resume with tasks.ranges.start")
        log.error("range %s part %s: %s", self.job.name, self.part, reason)
        with self.sessions.begin() as session:
            failed = affected(session.execute(self.guard(fence).values(
                status=S.FAILED, owner=None, error=reason, finished_at=utcnow())))
            if failed:
                record_failure(session, self.job.name, self.part, self.owner, reason)
        DeadLetters(self.sessions).add(DEAD_LETTER_KIND, f"{self.job.name}:{self.part}", reason, {
            "job": self.job.name, "part": self.part, "lo": claimed.lo, "hi": claimed.hi,
            "checkpoint": claimed.next_id, "crashes": claimed.crashes, "claims": claimed.claims})


def hand_back_dead(session: Session, job: str, owner: str, note: str) -> list[tuple[int, int]]:
    """Hand back, in `session`'s transaction, every partition of `job` that the process
    `owner` was running when it died; returns each one's (part, fence).

    Each goes back to pending with its fence kept, so its next claim takes a newer one; from
    this write on no write of the dead holder matches (each needs `running` and its fence).
    One crash is counted, as the claim of a row left `running` would count it: a partition
    that keeps killing its pool process is still failed at the redelivery cap. `note` says
    what happened in the row's `error` until that claim; `dispatched_at` is now (the caller
    dispatches it), so the reconciler does not send it a second time."""
    rows = session.execute(select(WORK.c.part, WORK.c.fence).where(
        partitions_of(job), WORK.c.status == S.RUNNING, WORK.c.owner == owner)).all()
    handed = []
    for part, fence in rows:
        moved = affected(session.execute(update(WORK).where(
            partitions_of(job), WORK.c.part == part, WORK.c.fence == fence,
            WORK.c.status == S.RUNNING, WORK.c.owner == owner)
            .values(status=S.PENDING, owner=None, crashes=WORK.c.crashes + 1, error=note,
                    throttled_until=None, dispatched_at=utcnow())))
        if moved == 1:
            handed.append((int(part), int(fence)))
    return handed


def park_idle(session: Session, job: str, part: int, fence: int, status: str) -> int:
    """Park `job`'s partition `part` that nobody holds (its job is paused or cancelled), if
    it is still as it was seen: `status` under `fence`. A holder that wakes up afterwards
    writes nothing (its fenced writes need `running`). Returns 1 if it was parked, else 0."""
    return affected(session.execute(update(WORK).where(
        partitions_of(job), WORK.c.part == part, WORK.c.fence == fence,
        WORK.c.status == status)
        .values(status=S.PAUSED, owner=None, throttled_until=None)))


def restart_finished(session: Session, job: str) -> int:
    """A new run of `job` walks its whole stored plan again (in the transaction that opens
    the run): every finished partition (done, empty or failed) goes back to pending from
    `lo`, its counts, takeovers and error cleared, so the run's rows, progress and ETA count
    its own work only. Its fence is kept: the next claim takes a newer one. An open
    partition (a job reconciled without a run) is left as it is. A keyed job's cursor goes
    back to `lo_key`. Returns how many."""
    return affected(session.execute(update(WORK).where(
        partitions_of(job), WORK.c.status.in_(S.FINISHED))
        .values(status=S.PENDING, next_id=WORK.c.lo, next_key=WORK.c.lo_key, rows_done=0,
                rows_skipped=0, rate=0.0, claims=0, crashes=0, error=None, owner=None,
                started_at=None, finished_at=None, dispatched_at=None, throttled_until=None)))
