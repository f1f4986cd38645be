"""Running one partition of a range job under a lease, batch by batch, exactly once.

Timeline of a takeover (why the fence, not the lease, is what keeps writes exactly once):

    t0  A acquires lease range:cm_data:3, fence 7; claims the work row (fence 7)
    t1  A reads rows 1001..2000 and is paused (GC, SIGSTOP, network) past the lease TTL
    t2  the lease expires; the reconciler dispatches part 3; B acquires it, fence 8, claims the
        work row (fence 8) and reads its checkpoint (1001): B processes 1001..2000 and commits
    t3  A wakes and commits its batch: the guard `UPDATE work_items ... WHERE fence = 7` matches
        no row, so A rolls back its effects and stops. Rows 1001..2000 were processed once.

The guard UPDATE is the first statement of the batch's transaction, so on PostgreSQL and
MariaDB it also row-locks the work row: a claim by a newer holder waits for an in-flight batch
to commit, then reads its checkpoint.

Which rows a run processes (README): the keyset pass walks `id >= next_id`, which misses a row
whose transaction took its id early and committed late (concurrent inserters commit out of id
order). So a partition is never marked done after its keyset pass alone: a closing pass reads
`lo..hi` from the start with the job's filter (rows still to do) and processes what it finds,
until a closing read finds nothing; that read and the `done` update are one transaction.

    t0  keyset pass: rows 1..100 committed; 101 (inserter A) is still uncommitted, 102
        (inserter B) commits; the runner processes 102, its next read from 103 is empty
    t1  A commits 101
    t2  closing read of 1..hi with `status = 0` finds 101: processed; the next closing read
        finds nothing, and the partition is done in that same transaction

A row committed after the closing read is found by the reconciler's late-commit check
(`RANGE_SETTLE` after the partition finished) or, above the checkpoint, by its growth check.

Poison partitions: a claim that finds the row still `running` takes over from a holder that
never released it (its process died, or it lost the lease or the database). `crashes` counts
such claims until a batch commits; past the redelivery cap the partition is failed and
dead-lettered instead of run again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from redis.exceptions import RedisError
from sqlalchemy import Connection, Row, bindparam, case, func, select, update
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from lease import Lease, LeaseLost, Leases, NotAcquired, NotHeld
from tasks.db import WRITE_INTENT, affected, is_redis_away, is_transient, utcnow
from tasks.deadletter import DeadLetters
from tasks.models import WORK
from tasks.models import PartitionStatus as S
from tasks.ranges.jobs import Context, InvalidArguments, RangeJob
from tasks.ranges.planning import Partition

__all__ = ["PartitionRunner", "Outcome", "Progress", "UnknownPartition", "FencedOut",
           "FilterNotCleared", "DEAD_LETTER_KIND"]

log = logging.getLogger("tasks.ranges")

# Dead letters of partitions that kept killing their worker.
DEAD_LETTER_KIND = "range-partition"

T = TypeVar("T")
# A test seam: called with the name of a step of the run ("keyset-done") as it passes it.
Seam = Callable[[str], None]


class UnknownPartition(InvalidArguments):
    """The partition was never planned (the reconciler plans partitions from the id bounds)."""


class FilterNotCleared(Exception):
    """The job's process function left a processed row matching the job's filter."""


class Outcome:
    """How a run of `PartitionRunner` ended."""

    BUSY = "busy"  # another worker holds the lease (a duplicate delivery)
    FINISHED = "finished"  # the partition was already done, empty or failed
    STALE = "stale"  # a newer holder claimed the row first
    DONE = S.DONE
    EMPTY = S.EMPTY
    FAILED = S.FAILED
    HANDED_OVER = "handed-over"  # stopped early on purpose; back to pending
    FENCED_OUT = "fenced-out"  # a newer holder took over; nothing of ours was written
    LOST = "lost"  # the lease was lost between batches; back to pending
    UNAVAILABLE = "db-unavailable"  # the database stayed away; left running for a takeover
    REDIS_UNAVAILABLE = "redis-unavailable"  # Redis was away; back to pending if possible


@dataclass
class Progress:
    job: str
    part: int
    checkpoint: int
    hi: int
    rows_done: int
    rows_per_s: float


class ShutdownFlag(Protocol):
    def is_set(self) -> bool: ...


class FencedOut(Exception):
    """A newer lease holder claimed the partition; this holder's batch was rolled back."""


@dataclass
class _Pass:
    """Where a run is: the keyset cursor, and the closing pass once the keyset pass is done."""

    next_id: int
    closing: bool = False
    checked: bool = False  # the filter contract was checked on a batch of this run
    closed_ids: frozenset[int] = frozenset()  # ids the previous closing batch processed


class PartitionRunner:
    """Runs `job`'s partition `part` until it is done, the time slice ends, or the worker stops.

    `crash_cap` is the redelivery cap: a partition whose holders died `crash_cap` times in a
    row without committing a batch is failed and dead-lettered when it is claimed again.
    """

    def __init__(
        self,
        job: RangeJob,
        part: int,
        *,
        sessions: sessionmaker[Session],
        leases: Leases,
        lease_ttl: float,
        owner: str,
        shutdown: ShutdownFlag,
        time_slice: float = 300.0,
        on_progress: Callable[[Progress], None] | None = None,
        retry_delays: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 4.0),
        clock: Callable[[], float] = time.monotonic,
        crash_cap: int = 5,
        seam: Seam | None = None,
    ) -> None:
        self.job, self.part = job, part
        self.sessions, self.leases = sessions, leases
        self.lease_ttl, self.owner = lease_ttl, owner
        self.shutdown, self.time_slice = shutdown, time_slice
        self.on_progress = on_progress
        self.retry_delays, self.clock = retry_delays, clock
        self.crash_cap = crash_cap
        self.seam = seam or (lambda _step: None)
        self.rows_done = 0
        self._compiled: tuple[Any, Any, Any] | None = None

    def run(self) -> str:
        """Run the partition; return an `Outcome`. Never raises for a data or lease problem."""
        row = self._load()
        if row.status in S.FINISHED:
            return Outcome.FINISHED
        try:
            lease = self.leases.acquire(self.job.lease_name(self.part), ttl=self.lease_ttl,
                                        fence_floor=row.fence)
        except NotAcquired:
            return Outcome.BUSY
        except (RedisError, OSError) as exc:
            log.warning("range %s part %s: Redis unavailable (%s); leaving it for later",
                        self.job.name, self.part, type(exc).__name__)
            return Outcome.REDIS_UNAVAILABLE
        try:
            return self._run_leased(lease)
        finally:
            try:
                lease.release()
            except (LeaseLost, NotHeld, RedisError, OSError):
                pass  # lost, or Redis is away: the lease lapses by its TTL

    def _load(self) -> Any:
        with self.sessions() as session:
            row = session.execute(
                select(WORK).where(WORK.c.kind == "range", WORK.c.job == self.job.name,
                                   WORK.c.part == self.part)
            ).first()
        if row is None:
            raise UnknownPartition(f"range job {self.job.name} has no partition {self.part} "
                                   "(not planned yet: start the job first)")
        return row

    def _run_leased(self, lease: Lease) -> str:
        claimed = self._claim(lease.fence)
        if claimed is None:
            return Outcome.STALE
        if claimed.crashes >= self.crash_cap:
            self._dead_letter(lease.fence, claimed)
            return Outcome.FAILED
        partition = Partition(self.part, claimed.lo, claimed.hi)
        state = _Pass(claimed.next_id)
        started = self.clock()
        pool = (ThreadPoolExecutor(self.job.parallelism, thread_name_prefix=f"{self.job.name}")
                if self.job.parallelism > 1 else None)
        try:
            while True:
                if self.shutdown.is_set() or self.clock() - started > self.time_slice:
                    self._release_to_pending(lease.fence)
                    return Outcome.HANDED_OVER
                lease.check()
                step = self._with_retries(lease, self._batch, lease, partition, state, pool,
                                          started)
                if isinstance(step, str):
                    return step
                if step is None:  # the keyset pass is done: the closing pass starts
                    self.seam("keyset-done")
                    state.closing = True
                    continue
                state.next_id = step
                lease.heartbeat()
                self._report(partition, state.next_id, started)
        except LeaseLost:
            log.warning("range %s part %s: lease lost; stopping", self.job.name, self.part)
            self._release_quietly(lease.fence)
            return Outcome.LOST
        except FencedOut:
            log.warning("range %s part %s: fenced out by a newer holder", self.job.name, self.part)
            return Outcome.FENCED_OUT
        except SoftTimeLimitExceeded:
            self._release_to_pending(lease.fence)
            raise
        except Exception as exc:  # a bug or bad data in this partition fails it, not the others
            return self._stopped_by(exc, lease.fence)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _stopped_by(self, exc: Exception, fence: int) -> str:
        if is_redis_away(exc):
            log.warning("range %s part %s: Redis unavailable (%s); leaving it for later",
                        self.job.name, self.part, type(exc).__name__)
            self._release_quietly(fence)
            return Outcome.REDIS_UNAVAILABLE
        if is_transient(exc):
            # Still away after every retry: not the partition's fault, so it is not
            # failed. The lease is released; the reconciler dispatches it again later.
            log.warning("range %s part %s: database unavailable (%s); leaving it for later",
                        self.job.name, self.part, type(exc).__name__)
            return Outcome.UNAVAILABLE
        log.exception("range %s part %s failed", self.job.name, self.part)
        self._fail(fence, exc)
        return Outcome.FAILED

    def _claim(self, fence: int) -> Any:
        now = utcnow()
        took_over = case((WORK.c.status == S.RUNNING, 1), else_=0)
        with self.sessions.begin() as session:
            # `crashes` first: MariaDB evaluates SET assignments left to right, so it must read
            # the old status before `status` is assigned.
            claimed = affected(session.execute(
                update(WORK)
                .where(WORK.c.kind == "range", WORK.c.job == self.job.name,
                       WORK.c.part == self.part, WORK.c.fence < fence,
                       WORK.c.status.in_(S.OPEN))
                .ordered_values(
                    (WORK.c.crashes, WORK.c.crashes + took_over), (WORK.c.fence, fence),
                    (WORK.c.status, S.RUNNING), (WORK.c.owner, self.owner),
                    (WORK.c.claims, WORK.c.claims + 1), (WORK.c.started_at, now),
                    (WORK.c.heartbeat_at, now), (WORK.c.error, None))
            ))
            if claimed != 1:
                return None
            return session.execute(
                select(WORK.c.id, WORK.c.lo, WORK.c.hi, WORK.c.next_id, WORK.c.crashes,
                       WORK.c.claims)
                .where(WORK.c.kind == "range", WORK.c.job == self.job.name,
                       WORK.c.part == self.part)
            ).one()

    def _dead_letter(self, fence: int, claimed: Any) -> None:
        """Fail a partition whose holders kept dying, and keep it as a dead letter."""
        reason = (f"its holders died {claimed.crashes} times in a row without committing a "
                  f"batch (REDELIVERY_CAP={self.crash_cap}): the partition keeps killing its "
                  "worker; fix it, then resume with tasks.ranges.start")
        log.error("range %s part %s: %s", self.job.name, self.part, reason)
        with self.sessions.begin() as session:
            session.execute(self._guard(fence).values(
                status=S.FAILED, owner=None, error=reason, finished_at=utcnow()))
        DeadLetters(self.sessions).add(DEAD_LETTER_KIND, f"{self.job.name}:{self.part}", reason, {
            "job": self.job.name, "part": self.part, "lo": claimed.lo, "hi": claimed.hi,
            "checkpoint": claimed.next_id, "crashes": claimed.crashes, "claims": claimed.claims})

    def _with_retries(self, lease: Lease, step: Callable[..., T], *args: Any) -> T:
        for delay in (*self.retry_delays, None):
            try:
                return step(*args)
            except (OperationalError, DBAPIError) as exc:
                if delay is None or not is_transient(exc):
                    raise
                log.warning("range %s part %s: transient database error (%s); retry in %.1fs",
                            self.job.name, self.part, type(exc.orig).__name__, delay)
                time.sleep(delay)
                lease.check()
        raise AssertionError("unreachable")

    def _guard(self, fence: int) -> Any:
        return (update(WORK).where(WORK.c.kind == "range", WORK.c.job == self.job.name,
                                   WORK.c.part == self.part, WORK.c.fence == fence,
                                   WORK.c.status == S.RUNNING))

    def _statements(self, partition: Partition) -> tuple[Any, Any, Any]:
        """The batch's keyset query, checkpoint guard and top-id query, built once per run."""
        job = self.job
        columns = [job.table.c[c] for c in job.columns] if job.columns else [job.table]
        query = select(*columns).where(job.id_col >= bindparam("from_id"),
                                       job.id_col <= partition.hi, job.where)
        query = query.order_by(job.id_col).limit(job.batch_size)
        guard = (update(WORK).where(WORK.c.kind == "range", WORK.c.job == job.name,
                                    WORK.c.part == self.part,
                                    WORK.c.fence == bindparam("mine"),
                                    WORK.c.status == S.RUNNING)
                 .values(next_id=bindparam("checkpoint"),
                         rows_done=WORK.c.rows_done + bindparam("batch_rows"),
                         heartbeat_at=bindparam("now"), rate=bindparam("rows_per_s"),
                         crashes=0))
        top = select(func.max(job.id_col)).where(job.id_col >= partition.lo,
                                                 job.id_col <= partition.hi)
        return query, guard, top

    def _batch(self, lease: Lease, partition: Partition, state: _Pass,
               pool: ThreadPoolExecutor | None, started: float) -> int | str | None:
        """Process one batch; return the new checkpoint, None when the keyset pass is done,
        or the final status when a closing read found nothing."""
        if self._compiled is None:
            self._compiled = self._statements(partition)
        query, guard, top_query = self._compiled
        with self.sessions.begin() as session:
            # One transaction per batch: read, guard, effects. On SQLite it begins IMMEDIATE
            # (it will write), on the other databases the guard row-locks the work row.
            conn = session.connection(execution_options=WRITE_INTENT)
            if state.closing:
                # The highest id read *before* the closing read: a row committed after that
                # read with a higher id reopens the partition (growth); one with an id up to
                # `top` is found by the late-commit check.
                top = conn.execute(top_query).scalar()
                rows = conn.execute(query, {"from_id": partition.lo}).all()
                if not rows:
                    return self._finish(conn, lease.fence, state.next_id, top)
                self._refuse_repeats(rows, state)
            else:
                rows = conn.execute(query, {"from_id": state.next_id}).all()
                if not rows:
                    return None
            last = int(getattr(rows[-1], self.job.id_column))
            checkpoint = max(state.next_id, last + 1)  # closing rows may lie below the cursor
            rate = (self.rows_done + len(rows)) / max(self.clock() - started, 1e-6)
            guarded = affected(conn.execute(guard, {
                "mine": lease.fence, "checkpoint": checkpoint, "batch_rows": len(rows),
                "now": utcnow(), "rows_per_s": rate}))
            if guarded != 1:
                raise FencedOut()
            self.job.process(rows, Context(session, lease.fence, self.job, partition, pool))
            if not state.checked or state.closing:
                self._check_cleared(conn, rows)
                state.checked = True
        self.rows_done += len(rows)
        return checkpoint

    def _refuse_repeats(self, rows: Sequence[Row[Any]], state: _Pass) -> None:
        ids = frozenset(int(getattr(r, self.job.id_column)) for r in rows)
        again = ids & state.closed_ids
        if again:
            raise FilterNotCleared(
                f"range job {self.job.name}: row {min(again)} still matches the job's filter "
                "after it was processed (the process function must make processed rows stop "
                "matching `where`)")
        state.closed_ids = ids

    def _check_cleared(self, conn: Connection, rows: Sequence[Row[Any]]) -> None:
        """The job's contract: a processed row no longer matches its filter (checked on the
        first batch of a run and on closing batches; a failure rolls the batch back)."""
        job = self.job
        ids = [getattr(r, job.id_column) for r in rows]
        left = conn.execute(select(job.id_col).where(job.id_col.in_(ids), job.where)
                            .limit(1)).scalar()
        if left is not None:
            raise FilterNotCleared(
                f"range job {job.name}: row {left} still matches the job's filter after it was "
                "processed (the process function must make processed rows stop matching "
                "`where`); nothing of this batch was written")

    def _report(self, partition: Partition, checkpoint: int, started: float) -> None:
        if self.on_progress is not None:
            rate = self.rows_done / max(self.clock() - started, 1e-6)
            self.on_progress(Progress(self.job.name, self.part, checkpoint, partition.hi,
                                      self.rows_done, rate))

    def _finish(self, conn: Connection, fence: int, next_id: int, top: int | None) -> str:
        """Mark the partition done (or empty), in the transaction of the closing read."""
        now = utcnow()
        status = case((WORK.c.rows_done > 0, S.DONE), else_=S.EMPTY)
        scanned = max(next_id, top + 1) if top is not None else next_id
        done = affected(conn.execute(self._guard(fence).values(
            status=status, owner=None, next_id=scanned, finished_at=now, heartbeat_at=now,
            settled_at=None, crashes=0)))
        if done != 1:
            raise FencedOut()
        final = conn.execute(select(WORK.c.status).where(
            WORK.c.kind == "range", WORK.c.job == self.job.name, WORK.c.part == self.part)
        ).scalar_one()
        log.info("range %s part %s: %s", self.job.name, self.part, final)
        return str(final)

    def _release_to_pending(self, fence: int) -> None:
        with self.sessions.begin() as session:
            session.execute(self._guard(fence).values(status=S.PENDING, owner=None))

    def _release_quietly(self, fence: int) -> None:
        """Best effort: a holder that stops without crashing says so (it is no crash)."""
        try:
            self._release_to_pending(fence)
        except (OperationalError, DBAPIError):
            log.warning("range %s part %s: could not hand the partition back; the reconciler "
                        "resumes it", self.job.name, self.part)

    def _fail(self, fence: int, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {exc}"[:2000]
        try:
            with self.sessions.begin() as session:
                session.execute(self._guard(fence).values(
                    status=S.FAILED, owner=None, error=reason, finished_at=utcnow()))
        except Exception:  # the database itself is gone; the lease lapses and it is retried
            log.exception("range %s part %s: could not record the failure", self.job.name,
                          self.part)
