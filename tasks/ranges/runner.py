"""Running one partition of a range job under a lease, batch by batch, exactly once.

Timeline of a takeover (why the fence, not the lease, is what keeps writes exactly once):

    t0  A acquires the partition's lease (`range_lease_name`), fence 7; claims the work row
        (fence 7)
    t1  A reads rows 1001..2000 and is paused (GC, SIGSTOP, network) past the lease TTL
    t2  the lease expires; the reconciler dispatches the partition; B acquires it, fence 8,
        claims the work row (fence 8) and reads its checkpoint (1001): B processes
        1001..2000 and commits
    t3  A wakes and commits its batch: the guard `UPDATE work_items ... WHERE fence = 7` matches
        no row, so A rolls back its effects and stops. Rows 1001..2000 were processed once.

The work row's fenced writes are in `workrow`, the batches and the keyset pass that decides
when a partition is done in `batches`, the outcomes in `outcomes`; this module holds the lease
and turns what stopped a run into its `Outcome`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from lease import Lease, LeaseLost, Leases, NotAcquired, NotHeld
from tasks.observe import tracing
from tasks.observe.logs import bind
from tasks.observe.metrics import record
from tasks.ranges.batches import Batches
from tasks.ranges.collections import PageBatches
from tasks.ranges.gate import ADOPT, Gate
from tasks.ranges.jobs import RangeJob
from tasks.ranges.keys import OUTAGE_TTL, range_outage_key
from tasks.ranges.metrics import RangeSeries
from tasks.ranges.outcomes import FencedOut, FilterNotCleared, Outcome, Progress, UnknownPartition
from tasks.ranges.planning import Partition
from tasks.ranges.runs import stored_params
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import DEAD_LETTER_KIND, WorkRow
from tasks.store.db import is_redis_away, is_transient, utcnow

# The outcomes, exceptions and dead-letter kind are re-exported: a run's caller needs them.
__all__ = ["PartitionRunner", "Outcome", "Progress", "UnknownPartition", "FencedOut",
           "FilterNotCleared", "DEAD_LETTER_KIND"]

log = logging.getLogger("tasks.ranges")

# A partition's fence counter in Redis (`fence:{range:JOB:PART}`) expires this long after its
# last acquire, so a finished job's 100,000 partitions do not keep 100,000 keys for ever. The
# work row's fence is the floor of every acquire (what keeps fences rising after FLUSHALL), so a
# counter that expired starts above every fence a holder ever wrote.
FENCE_TTL_S = 86_400.0

T = TypeVar("T")
# A test seam: called with the name of a step of the run ("keyset-done") as it passes it.
Seam = Callable[[str], None]


class ShutdownFlag(Protocol):
    def is_set(self) -> bool: ...


class Steps(Protocol):
    """The batches of one run of a partition: a table's keyset pass (`Batches`) or a custom
    collection's pages (`PageBatches`)."""

    rows_done: int
    started: float
    partition: Partition

    @property
    def size(self) -> int:
        """Rows the next batch reads at most."""

    def step(self, fence: int, pool: ThreadPoolExecutor | None) -> int | str: ...


class PartitionRunner:
    """Runs `job`'s partition `part` until it is done, the time slice ends, or the worker stops.

    `crash_cap` is the redelivery cap: a partition whose holders died `crash_cap` times in a
    row without committing a batch is failed and dead-lettered when it is claimed again.

    With `may_adopt`, the run stops at a batch boundary (`Outcome.YIELDED`, its partition back
    to pending) when it adopted an orphan of its job (`tasks.ranges.gate`); the partition to
    run next is then `adopted`.
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
        may_adopt: bool = False,
    ) -> None:
        self.job, self.part = job, part
        self.row = WorkRow(job, part, sessions, owner)
        self.leases, self.lease_ttl = leases, lease_ttl
        self.shutdown, self.time_slice = shutdown, time_slice
        self.on_progress = on_progress
        self.retry_delays, self.clock = retry_delays, clock
        self.crash_cap = crash_cap
        self.seam = seam or (lambda _step: None)
        self.batches: Steps | None = None
        self.may_adopt = may_adopt
        self.adopted: int | None = None

    @property
    def rows_done(self) -> int:
        """Rows this run processed (in committed batches)."""
        return self.batches.rows_done if self.batches is not None else 0

    def run(self) -> str:
        """Run the partition; return an `Outcome`. Never raises for a data or lease problem."""
        row = self.row.load()
        if row.status in S.FINISHED:
            return Outcome.FINISHED
        if row.status == S.PAUSED:
            return Outcome.PAUSED
        try:
            lease = self.leases.acquire(self.job.lease_name(self.part), ttl=self.lease_ttl,
                                        fence_floor=row.fence, fence_ttl=FENCE_TTL_S)
        except NotAcquired:
            return Outcome.BUSY
        except (RedisError, OSError) as exc:
            log.warning("range %s part %s: Redis unavailable (%s); leaving it for later",
                        self.job.name, self.part, type(exc).__name__)
            return Outcome.REDIS_UNAVAILABLE
        try:
            return self._run_leased(lease, self._outage_fence(row))
        finally:
            try:
                lease.release()
            except (LeaseLost, NotHeld, RedisError, OSError):
                pass  # lost, or Redis is away: the lease lapses by its TTL

    def _run_leased(self, lease: Lease, outage_fence: int | None = None) -> str:
        claimed = self.row.claim(lease.fence, outage_fence=outage_fence)
        if claimed is None:
            return Outcome.STALE
        if claimed.crashes >= self.crash_cap:
            self.row.dead_letter(lease.fence, claimed, self.crash_cap)
            return Outcome.FAILED
        if claimed.crashes and record.on is not None:  # took over from a holder gone silent
            record.on.of(RangeSeries).range_takeovers.labels(self.job.name).inc()
        pool = (ThreadPoolExecutor(self.job.parallelism, thread_name_prefix=f"{self.job.name}")
                if self.job.parallelism > 1 else None)
        try:
            # Parameters that no longer fit the job's class fail the partition, with why.
            batches = self.batches = self._batches(claimed)
            with bind(job=self.job.name, partition=self.part, fence=lease.fence):
                return self._loop(lease, batches, pool)
        except LeaseLost:
            log.warning("range %s part %s: lease lost; stopping", self.job.name, self.part)
            self.row.release_quietly(lease.fence)
            return Outcome.LOST
        except FencedOut:
            log.warning("range %s part %s: fenced out by a newer holder", self.job.name, self.part)
            if record.on is not None:
                record.on.of(RangeSeries).range_fenced_out.labels(self.job.name).inc()
            return Outcome.FENCED_OUT
        except SoftTimeLimitExceeded:
            self.row.release_to_pending(lease.fence)
            raise
        except Exception as exc:  # a bug or bad data in this partition fails it, not the others
            return self._stopped_by(exc, lease.fence)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _batches(self, claimed: Any) -> Steps:
        """The batches of this run from the claimed row, with the parameters of the job's
        run (`ctx.params`, and the filter when it is a function of them)."""
        params = None
        if self.job.params is not None:
            with self.row.sessions() as session:
                params = self.job.params_of(stored_params(session, self.job.name))
        key = self.job.keyset  # a keyed job's bounds and cursor (tasks.ranges.jobkeys)
        partition = Partition(self.part, claimed.lo, claimed.hi, key.decode(claimed.lo_key),
                              key.decode(claimed.hi_key))
        if self.job.pages is not None:  # a custom collection: its place is its cursor
            return PageBatches(self.row, partition, cursor=claimed.collection_cursor,
                               clock=self.clock, params=params, run=claimed.run)
        return Batches(self.row, partition, next_id=claimed.next_id, clock=self.clock,
                       lease_ttl=self.lease_ttl, params=params, run=claimed.run,
                       next_key=key.decode(claimed.next_key))

    def _loop(self, lease: Lease, batches: Steps, pool: ThreadPoolExecutor | None) -> str:
        """Batch after batch until the partition is finished or the run must stop."""
        gate = Gate(self.leases.client, self.job, self.lease_ttl, may_adopt=self.may_adopt,
                    part=self.part,
                    note=lambda seconds: self.row.note_throttled(lease.fence, seconds))
        rows_before = batches.rows_done
        while True:
            if self.shutdown.is_set() or self.clock() - batches.started > self.time_slice:
                self.row.release_to_pending(lease.fence)
                return Outcome.HANDED_OVER
            lease.check()
            waited = self.clock()
            stop = gate.before_batch(lease, batches.rows_done - rows_before)
            waited = self.clock() - waited
            if waited > 0.01 and record.on is not None:  # more than the gate's round trip
                record.on.of(RangeSeries).range_throttle_wait.labels(self.job.name).inc(waited)
            rows_before = batches.rows_done
            if stop == ADOPT:
                return self._yield_to(gate.adopted, lease)
            if stop is not None:
                log.info("range %s part %s: %s; stopping after the last batch", self.job.name,
                         self.part, stop)
                self.row.park(lease.fence)
                return Outcome.PAUSED
            with tracing.batch(self.job.name, self.part, lease.fence, batches.size) as span:
                step = self._with_retries(lease, batches.step, lease.fence, pool)
                span.done(batches.rows_done - rows_before, step)
            if isinstance(step, str):  # the keyset pass ended: the partition's final status
                self.seam("keyset-done")
                return step
            lease.heartbeat()
            self._report(batches, step)

    def _yield_to(self, orphan: int | None, lease: Lease) -> str:
        """Hand this partition back to run `orphan`, whose holder died, in its place."""
        log.info("range %s part %s: adopting part %s, whose holder died; this one goes back "
                 "to the queue", self.job.name, self.part, orphan)
        self.row.release_to_pending(lease.fence)
        self.adopted = orphan
        return Outcome.YIELDED

    def _stopped_by(self, exc: Exception, fence: int) -> str:
        if is_redis_away(exc):
            log.warning("range %s part %s: Redis unavailable (%s); leaving it for later",
                        self.job.name, self.part, type(exc).__name__)
            self.row.release_quietly(fence)
            return Outcome.REDIS_UNAVAILABLE
        if is_transient(exc):
            # Still away after every retry (a lost connection, a lock timeout, a busy SQLite
            # file): not the partition's fault and no crash. It is handed back like a Redis
            # outage; the reconciler dispatches it again later.
            self._hand_back_after_outage(fence, exc)
            return Outcome.UNAVAILABLE
        log.exception("range %s part %s failed", self.job.name, self.part)
        self.row.fail(fence, exc)
        return Outcome.FAILED

    def _hand_back_after_outage(self, fence: int, exc: Exception) -> None:
        cause = type(getattr(exc, "orig", None) or exc).__name__
        note = f"database unavailable ({cause}); handed back at {utcnow():%H:%M:%S} UTC"
        log.warning("range %s part %s: %s", self.job.name, self.part, note)
        for delay in (*self.retry_delays[:2], None):
            try:
                self.row.release_to_pending(fence, note=note)
                return
            except (OperationalError, DBAPIError):
                if delay is None:
                    break
                time.sleep(delay)
        # The row stays `running`: mark this fence in Redis, so the next claim knows its
        # holder stopped for an outage and does not count a crash towards REDELIVERY_CAP.
        try:
            self.leases.client.set(range_outage_key(self.job.name, self.part), fence,
                                   ex=OUTAGE_TTL)
        except (RedisError, OSError):
            log.warning("range %s part %s: could not mark the outage either; the next claim "
                        "counts a crash", self.job.name, self.part)

    def _outage_fence(self, row: Any) -> int | None:
        """The fence of a holder that stopped for an outage with the row left `running`."""
        if row.status != S.RUNNING:
            return None
        try:
            mark = self.leases.client.get(range_outage_key(self.job.name, self.part))
        except (RedisError, OSError):
            return None
        return int(mark) if mark is not None else None

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

    def _report(self, batches: Steps, checkpoint: int) -> None:
        if self.on_progress is not None:
            rate = batches.rows_done / max(self.clock() - batches.started, 1e-6)
            self.on_progress(Progress(self.job.name, self.part, checkpoint, batches.partition.hi,
                                      batches.rows_done, rate))
