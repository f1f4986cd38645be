"""A partition whose holder died goes ahead of fresh work (tasks/ranges/gate.py, "Adoption"),
in-process on a real Redis and all three databases: the reconciler offers it to the job's
running holders, one of them hands its own partition back at a batch boundary (checkpoint
kept) and runs the orphan instead, and nothing is processed twice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from sqlalchemy import Engine, Row
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import mark_processed
from examples.seed import seed_cm_data
from lease import Leases
from lease.keys import lease_key
from tasks.ranges.gate import Gate
from tasks.ranges.jobs import Context, RangeJob
from tasks.ranges.keys import range_control_key, range_orphans_key
from tasks.ranges.reconciler import activate, reconcile_job
from tasks.ranges.runner import Outcome
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import WorkRow
from tests.ranges.test_runner import counts, plan, runner, small, work

ORPHANS = range_orphans_key("cm_data")


def orphan(job: RangeJob, part: int, sessions: sessionmaker[Session], leases: Leases,
           client: redis.Redis) -> None:
    """`part`'s holder claims it, then dies: its lease lapses with the row still running."""
    dead = leases.acquire(job.lease_name(part), ttl=10)
    assert WorkRow(job, part, sessions, "dead:1").claim(dead.fence) is not None
    client.delete(lease_key(job.lease_name(part)))


def reconcile(job: RangeJob, sessions: sessionmaker[Session], client: redis.Redis) -> list[int]:
    activate(sessions, job)  # the round is due now
    sent: list[int] = []
    reconcile_job(sessions, client, job, lambda _j, p: sent.append(p), interval=1, grace=0)
    # grace=0 gives the offer a TTL of 1 s; a busy machine's runner outlasted it and the
    # offer was gone before the test looked (the TTL is not what these tests check).
    client.expire(range_orphans_key(job.name), 60)
    return sent


def planned(engine: Engine, sessions: sessionmaker[Session], client: redis.Redis,
            rows: int) -> RangeJob:
    """`rows` rows in partitions of 100, planned; the job."""
    seed_cm_data(engine, rows)
    job = small(partition_size=100, batch_size=10)
    plan(sessions, client, job)
    return job


def test_a_running_holder_adopts_an_orphan_and_hands_its_own_partition_back(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 300)
    calls: list[int] = []

    def process(rows: Sequence[Row[Any]], ctx: Context) -> None:
        mark_processed(rows, ctx)
        calls.append(ctx.partition.part)
        if ctx.partition.part == 0 and len(calls) == 2:
            # Meanwhile a reconcile round offers partition 1 (its writes would wait for this
            # batch's SQLite write lock, so only its Redis side is done here).
            redis_client.sadd(ORPHANS, 1)

    job = small(partition_size=100, batch_size=10, process=process)
    assert plan(sessions, redis_client, job) == [0, 1, 2]
    orphan(job, 1, sessions, leases, redis_client)  # partition 1's holder died
    first = runner(job, 0, sessions, leases, may_adopt=True)
    assert first.run() == Outcome.YIELDED and first.adopted == 1
    # Partition 0 is back to pending from its checkpoint: two batches were committed.
    row = work(engine, 0)
    assert (row.status, row.next_id, row.rows_done, row.owner) == (S.PENDING, 21, 20, None)
    assert redis_client.scard(ORPHANS) == 0  # popped: no other holder adopts it too
    assert runner(job, 1, sessions, leases).run() == Outcome.DONE
    assert work(engine, 1).claims == 2  # the dead holder's claim, then the adopter's
    for part in (0, 2):
        assert runner(job, part, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 300}
    assert work(engine, 0).rows_done == 100


def test_only_a_holder_that_may_adopt_takes_an_orphan(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    job = planned(engine, sessions, redis_client, 200)
    orphan(job, 1, sessions, leases, redis_client)
    assert 1 in reconcile(job, sessions, redis_client)
    assert redis_client.smembers(ORPHANS) == {b"1"}  # partition 0, pending too, is not one
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE  # may_adopt off
    assert redis_client.smembers(ORPHANS) == {b"1"}
    # Claiming the orphan the usual way (its queued message) takes it off the offer.
    assert runner(job, 1, sessions, leases, may_adopt=True).run() == Outcome.DONE
    assert redis_client.scard(ORPHANS) == 0
    assert counts(engine) == {1: 200}


def test_a_pending_partition_is_not_offered_and_a_paused_job_adopts_nothing(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    job = planned(engine, sessions, redis_client, 200)
    # A partition nobody ever claimed is fresh work, not an orphan.
    assert reconcile(job, sessions, redis_client) == [0, 1]
    assert redis_client.scard(ORPHANS) == 0
    redis_client.sadd(ORPHANS, 1)
    redis_client.hset(range_control_key("cm_data"), "state", "paused")
    lease = leases.acquire(job.lease_name(0), ttl=10)
    gate = Gate(redis_client, job, 10.0, may_adopt=True)
    assert gate.before_batch(lease, 0) == "paused"
    assert gate.adopted is None and redis_client.smembers(ORPHANS) == {b"1"}
