"""The partition runner and the reconciler in-process, on a real Redis and all three databases."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, Row, func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import cm_data, mark_processed
from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from lease import Leases
from lease.keys import fence_key
from tasks.ranges.batches import Batches
from tasks.ranges.jobs import Context, RangeJob
from tasks.ranges.reconciler import activate, reconcile_job
from tasks.ranges.runner import (
    FENCE_TTL_S,
    FencedOut,
    Outcome,
    PartitionRunner,
    UnknownPartition,
)
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.tables import WorkItem

DATA = CM_DATA
WORK = WorkItem.__table__


def small(job: RangeJob = cm_data, **changes: Any) -> RangeJob:
    return dataclasses.replace(job, **{"partition_size": 1000, "batch_size": 100,
                                       "parallelism": 1, **changes})


def plan(sessions: sessionmaker[Session], client: redis.Redis, job: RangeJob) -> list[int]:
    """Plan the job's partitions with one reconcile round; return what it dispatched."""
    activate(sessions, job)
    sent: list[int] = []
    reconcile_job(sessions, client, job, lambda _j, p: sent.append(p), interval=1, grace=0)
    return sent


def runner(job: RangeJob, part: int, sessions: sessionmaker[Session], leases: Leases,
           **kwargs: Any) -> PartitionRunner:
    options: dict[str, Any] = {"lease_ttl": 5.0, "owner": "test", "shutdown": threading.Event(),
                               "retry_delays": (0.01, 0.02, 0.05)}
    options.update(kwargs)
    return PartitionRunner(job, part, sessions=sessions, leases=leases, **options)


def counts(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        rows = conn.execute(select(DATA.c.processed_count, func.count())
                            .group_by(DATA.c.processed_count)).all()
    return {int(c): int(n) for c, n in rows}


def work(engine: Engine, part: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(WORK).where(WORK.c.part == part)).one()


def test_partitions_run_to_done_exactly_once(engine: Engine, sessions: sessionmaker[Session],
                                            leases: Leases, redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 2500)
    job = small()
    assert plan(sessions, redis_client, job) == [0, 1, 2]
    for part in (0, 1, 2):
        assert runner(job, part, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 2500}
    assert [work(engine, p).rows_done for p in (0, 1, 2)] == [1000, 1000, 500]
    # A duplicate delivery of a finished partition changes nothing.
    assert runner(job, 1, sessions, leases).run() == Outcome.FINISHED
    assert counts(engine) == {1: 2500}
    assert not redis_client.keys("lease:*")


def test_a_partition_without_matching_rows_is_empty(engine: Engine, leases: Leases,
                                                   sessions: sessionmaker[Session],
                                                   redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 1500)
    with engine.begin() as conn:
        conn.execute(update(DATA).where(DATA.c.id <= 1000).values(status=1))
    job = small()
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.EMPTY
    assert runner(job, 1, sessions, leases).run() == Outcome.DONE


def test_a_paused_holder_is_fenced_out_and_writes_nothing(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 1000)
    job = small()
    plan(sessions, redis_client, job)
    old = runner(job, 0, sessions, leases)
    old_lease = leases.acquire(job.lease_name(0), ttl=5.0)
    assert old.row.claim(old_lease.fence) is not None
    redis_client.delete(*redis_client.keys("lease:*"))  # the old holder's lease lapsed
    new = runner(job, 0, sessions, leases)
    new_lease = leases.acquire(job.lease_name(0), ttl=5.0)
    assert new_lease.fence > old_lease.fence
    assert new.row.claim(new_lease.fence) is not None
    claimed = work(engine, 0)
    # The old holder wakes up and commits the batch it had read: refused, nothing written.
    with pytest.raises(FencedOut):
        Batches(old.row, job_partition(claimed), next_id=claimed.lo).step(old_lease.fence, None)
    assert counts(engine) == {0: 1000}
    assert work(engine, 0).next_id == claimed.next_id
    # The new holder's batch is accepted.
    batches = Batches(new.row, job_partition(claimed), next_id=claimed.lo)
    assert batches.step(new_lease.fence, None) == 101
    assert counts(engine) == {0: 900, 1: 100}
    new_lease.release()


def job_partition(row: Any) -> Any:
    from tasks.ranges.planning import Partition

    return Partition(row.part, row.lo, row.hi)


def test_a_failing_partition_is_marked_failed_and_others_finish(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 2000)

    def picky(rows: Sequence[Row[Any]], ctx: Context) -> None:
        if ctx.partition.part == 0:
            raise ValueError("row 7 is malformed")
        mark_processed(rows, ctx)

    job = small(process=picky)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.FAILED
    assert runner(job, 1, sessions, leases).run() == Outcome.DONE
    failed = work(engine, 0)
    assert failed.status == S.FAILED and "row 7 is malformed" in failed.error
    assert counts(engine) == {0: 1000, 1: 1000}
    # Resuming the job resets failed partitions to pending.
    assert activate(sessions, job) == 1
    assert work(engine, 0).status == S.PENDING


def test_transient_database_errors_are_retried(engine: Engine, sessions: sessionmaker[Session],
                                               leases: Leases, redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 500)
    failures = [2]

    def flaky(rows: Sequence[Row[Any]], ctx: Context) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OperationalError("UPDATE", {}, ConnectionError("server closed the connection"))
        mark_processed(rows, ctx)

    job = small(process=flaky)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 500}


def test_a_requested_shutdown_hands_the_partition_back(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 1000)
    stop = threading.Event()

    def one_batch_then_stop(rows: Sequence[Row[Any]], ctx: Context) -> None:
        mark_processed(rows, ctx)
        stop.set()

    job = small(process=one_batch_then_stop)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases, shutdown=stop).run() == Outcome.HANDED_OVER
    row = work(engine, 0)
    assert (row.status, row.owner, row.next_id, row.rows_done) == (S.PENDING, None, 101, 100)
    assert not redis_client.exists(f"lease:{{{job.lease_name(0)}}}")
    assert runner(small(), 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 1000}


def test_an_unplanned_partition_is_rejected(engine: Engine, sessions: sessionmaker[Session],
                                            leases: Leases) -> None:
    with pytest.raises(UnknownPartition, match="no partition 9"):
        runner(small(), 9, sessions, leases).run()


def test_a_lost_fence_counter_never_hands_out_an_old_fence(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)
    job = small(batch_size=100)
    plan(sessions, redis_client, job)
    stop = threading.Event()
    stop.set()
    for _ in range(3):  # three claims: the stored fence climbs to 3
        runner(job, 0, sessions, leases, shutdown=stop).run()
    stored = work(engine, 0).fence
    redis_client.flushdb()  # Redis lost everything, fence counters included
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert work(engine, 0).fence > stored
    assert counts(engine) == {1: 300}


def test_a_partitions_fence_counter_expires_a_day_after_its_last_acquire(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)
    job = small(batch_size=100)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    counter = fence_key(job.lease_name(0))
    assert int(redis_client.get(counter) or 0) == work(engine, 0).fence
    assert 0 < redis_client.ttl(counter) <= FENCE_TTL_S  # not kept for ever
    redis_client.delete(counter)  # expired: the next holder starts above the stored fence
    stored = work(engine, 0).fence
    with engine.begin() as conn:
        conn.execute(update(DATA).values(status=0))
    redis_client.delete(*redis_client.keys("lease:*") or ["-"])
    activate(sessions, job)
    with engine.begin() as conn:
        conn.execute(update(WORK).where(WORK.c.part == 0).values(status=S.PENDING))
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert work(engine, 0).fence > stored


def test_reconcile_plans_new_partitions_and_the_closing_read_reopens_grown_ones(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 1500)
    job = small()
    assert plan(sessions, redis_client, job) == [0, 1]
    for part in (0, 1):
        runner(job, part, sessions, leases).run()
    seed_cm_data(engine, 1000)  # ids 1501..2500: part 1 grows, part 2 appears

    def one_round() -> tuple[Any, list[int]]:
        with sessions.begin() as session:  # let the next round run now
            session.execute(update(WorkItem.__table__).values(dispatched_at=None))
        sent: list[int] = []
        activate(sessions, job)
        return reconcile_job(sessions, redis_client, job, lambda _j, p: sent.append(p),
                             interval=1, grace=0), sent

    report, sent = one_round()  # part 2 is open: no closing read yet
    assert (report.planned, report.reopened, report.closing_s, sent) == (1, 0, None, [2])
    assert runner(job, 2, sessions, leases).run() == Outcome.DONE
    report, sent = one_round()  # every partition finished: the closing read finds 1501..2000
    assert (report.planned, report.reopened, sent) == (0, 1, [1])
    assert report.closing_s is not None and report.late > 0
    assert runner(job, 1, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 2500}


def test_only_one_concurrent_round_runs_and_leased_partitions_are_skipped(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 3000)
    job = small()
    activate(sessions, job)
    results: list[Any] = []
    barrier = threading.Barrier(4)

    def one_round() -> None:
        barrier.wait()
        results.append(reconcile_job(sessions, redis_client, job, lambda _j, _p: None,
                                     interval=60, grace=0))

    threads = [threading.Thread(target=one_round) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.ran for r in results) == 1
    held = leases.acquire(job.lease_name(1), ttl=5.0)
    activate(sessions, job)  # due again now
    sent: list[int] = []
    reconcile_job(sessions, redis_client, job, lambda _j, p: sent.append(p), interval=60, grace=0)
    assert sent == [0, 2]
    held.release()


def test_a_duplicate_delivery_while_the_partition_is_leased_exits_at_once(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 500)
    job = small()
    plan(sessions, redis_client, job)
    held = leases.acquire(job.lease_name(0), ttl=5.0)
    assert runner(job, 0, sessions, leases).run() == Outcome.BUSY
    row = work(engine, 0)
    assert (row.status, row.claims, row.next_id) == (S.PENDING, 0, 1)
    assert counts(engine) == {0: 500}
    held.release()


def test_a_database_that_stays_away_leaves_the_partition_for_later_not_failed(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)

    def unreachable(rows: Sequence[Row[Any]], ctx: Context) -> None:
        raise OperationalError("UPDATE", {}, ConnectionError("server closed the connection"))

    job = small(process=unreachable)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.UNAVAILABLE
    row = work(engine, 0)  # handed back, as after a Redis outage: no crash is counted
    assert row.status == S.PENDING and row.next_id == 1 and row.crashes == 0
    assert row.error.startswith("database unavailable (ConnectionError)")
    assert not redis_client.exists(f"lease:{{{job.lease_name(0)}}}")  # free for a takeover
    assert runner(small(), 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 300}
