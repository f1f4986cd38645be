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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import bindparam, case, func, select, update
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from lease import Lease, LeaseLost, Leases, NotAcquired, NotHeld
from tasks.jobs import Context, InvalidArguments, RangeJob
from tasks.models import WORK, WRITE_INTENT, affected, utcnow
from tasks.models import PartitionStatus as S
from tasks.planning import Partition

__all__ = ["PartitionRunner", "Outcome", "Progress", "UnknownPartition", "FencedOut",
           "is_transient"]

log = logging.getLogger("tasks.ranges")


T = TypeVar("T")


class UnknownPartition(InvalidArguments):
    """The partition was never planned (the reconciler plans partitions from the id bounds)."""


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
    LOST = "lost"  # the lease was lost between batches
    UNAVAILABLE = "db-unavailable"  # the database stayed away; left running for a takeover


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


def is_transient(exc: BaseException) -> bool:
    """Database errors worth retrying: a lost connection, a lock timeout, a busy SQLite file."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError)


class FencedOut(Exception):
    """A newer lease holder claimed the partition; this holder's batch was rolled back."""


class PartitionRunner:
    """Runs `job`'s partition `part` until it is done, the time slice ends, or the worker stops."""

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
    ) -> None:
        self.job, self.part = job, part
        self.sessions, self.leases = sessions, leases
        self.lease_ttl, self.owner = lease_ttl, owner
        self.shutdown, self.time_slice = shutdown, time_slice
        self.on_progress = on_progress
        self.retry_delays, self.clock = retry_delays, clock
        self.rows_done = 0
        self._compiled: tuple[Any, Any] | None = None

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
        try:
            return self._run_leased(lease)
        finally:
            try:
                lease.release()
            except (LeaseLost, NotHeld):
                pass

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
        partition = Partition(self.part, claimed.lo, claimed.hi)
        next_id = claimed.next_id
        started = self.clock()
        pool = (ThreadPoolExecutor(self.job.parallelism, thread_name_prefix=f"{self.job.name}")
                if self.job.parallelism > 1 else None)
        try:
            while True:
                if self.shutdown.is_set() or self.clock() - started > self.time_slice:
                    self._release_to_pending(lease.fence)
                    return Outcome.HANDED_OVER
                lease.check()
                step = self._with_retries(lease, self._batch, lease, partition, next_id, pool,
                                          started)
                if step is None:
                    return self._with_retries(lease, self._finish, lease.fence, partition,
                                              next_id)
                next_id = step
                lease.heartbeat()
        except LeaseLost:
            log.warning("range %s part %s: lease lost; stopping", self.job.name, self.part)
            return Outcome.LOST
        except FencedOut:
            log.warning("range %s part %s: fenced out by a newer holder", self.job.name, self.part)
            return Outcome.FENCED_OUT
        except SoftTimeLimitExceeded:
            self._release_to_pending(lease.fence)
            raise
        except Exception as exc:  # a bug or bad data in this partition fails it, not the others
            if is_transient(exc):
                # Still away after every retry: not the partition's fault, so it is not
                # failed. The lease is released; the reconciler dispatches it again later.
                log.warning("range %s part %s: database unavailable (%s); leaving it for later",
                            self.job.name, self.part, type(exc).__name__)
                return Outcome.UNAVAILABLE
            log.exception("range %s part %s failed", self.job.name, self.part)
            self._fail(lease.fence, exc)
            return Outcome.FAILED
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _claim(self, fence: int) -> Any:
        now = utcnow()
        with self.sessions.begin() as session:
            claimed = affected(session.execute(
                update(WORK)
                .where(WORK.c.kind == "range", WORK.c.job == self.job.name,
                       WORK.c.part == self.part, WORK.c.fence < fence,
                       WORK.c.status.in_(S.OPEN))
                .values(fence=fence, status=S.RUNNING, owner=self.owner, claims=WORK.c.claims + 1,
                        started_at=now, heartbeat_at=now, error=None)
            ))
            if claimed != 1:
                return None
            return session.execute(
                select(WORK.c.id, WORK.c.lo, WORK.c.hi, WORK.c.next_id)
                .where(WORK.c.kind == "range", WORK.c.job == self.job.name,
                       WORK.c.part == self.part)
            ).one()

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

    def _statements(self, partition: Partition) -> tuple[Any, Any]:
        """The batch's keyset query and checkpoint guard, built once per run."""
        job = self.job
        columns = [job.table.c[c] for c in job.columns] if job.columns else [job.table]
        query = select(*columns).where(job.id_col >= bindparam("from_id"),
                                       job.id_col <= partition.hi)
        if job.where is not None:
            query = query.where(job.where)
        query = query.order_by(job.id_col).limit(job.batch_size)
        guard = (update(WORK).where(WORK.c.kind == "range", WORK.c.job == job.name,
                                    WORK.c.part == self.part,
                                    WORK.c.fence == bindparam("mine"),
                                    WORK.c.status == S.RUNNING)
                 .values(next_id=bindparam("checkpoint"),
                         rows_done=WORK.c.rows_done + bindparam("batch_rows"),
                         heartbeat_at=bindparam("now"), rate=bindparam("rows_per_s")))
        return query, guard

    def _batch(self, lease: Lease, partition: Partition, next_id: int,
               pool: ThreadPoolExecutor | None, started: float) -> int | None:
        """Process one batch from `next_id`; return the new checkpoint, or None when done."""
        job = self.job
        if self._compiled is None:
            self._compiled = self._statements(partition)
        query, guard = self._compiled
        with self.sessions.begin() as session:
            # One transaction per batch: read, guard, effects. On SQLite it begins IMMEDIATE
            # (it will write), on the other databases the guard row-locks the work row.
            conn = session.connection(execution_options=WRITE_INTENT)
            rows = conn.execute(query, {"from_id": next_id}).all()
            if not rows:
                return None
            last = getattr(rows[-1], job.id_column)
            rate = (self.rows_done + len(rows)) / max(self.clock() - started, 1e-6)
            guarded = affected(conn.execute(guard, {
                "mine": lease.fence, "checkpoint": last + 1, "batch_rows": len(rows),
                "now": utcnow(), "rows_per_s": rate}))
            if guarded != 1:
                raise FencedOut()
            job.process(rows, Context(session, lease.fence, job, partition, pool))
        self.rows_done += len(rows)
        if self.on_progress is not None:
            self.on_progress(Progress(job.name, self.part, last + 1, partition.hi,
                                      self.rows_done, rate))
        return int(last) + 1

    def _finish(self, fence: int, partition: Partition, next_id: int) -> str:
        job = self.job
        with self.sessions() as session:
            max_id = session.execute(select(func.max(job.id_col))).scalar()
        scanned_to = min(partition.hi, max_id if max_id is not None else partition.lo - 1)
        status = case((WORK.c.rows_done > 0, S.DONE), else_=S.EMPTY)
        with self.sessions.begin() as session:
            done = affected(session.execute(
                self._guard(fence).values(
                    status=status, owner=None, next_id=max(next_id, scanned_to + 1),
                    finished_at=utcnow(), heartbeat_at=utcnow())
            ))
            if done != 1:
                raise FencedOut()
            final = session.execute(select(WORK.c.status).where(
                WORK.c.kind == "range", WORK.c.job == job.name, WORK.c.part == self.part)
            ).scalar_one()
        log.info("range %s part %s: %s", job.name, self.part, final)
        return str(final)

    def _release_to_pending(self, fence: int) -> None:
        with self.sessions.begin() as session:
            session.execute(self._guard(fence).values(status=S.PENDING, owner=None))

    def _fail(self, fence: int, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {exc}"[:2000]
        try:
            with self.sessions.begin() as session:
                session.execute(self._guard(fence).values(
                    status=S.FAILED, owner=None, error=reason, finished_at=utcnow()))
        except Exception:  # the database itself is gone; the lease lapses and it is retried
            log.exception("range %s part %s: could not record the failure", self.job.name,
                          self.part)
