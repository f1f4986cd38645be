"""A pool process's death frees its partitions at once (`tasks.ranges.poolexit`): in-process
on all three databases, then on real prefork workers whose pool process is SIGKILLed."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

import pytest
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import cm_data
from examples.seed import seed_cm_data
from lease import Leases
from tasks.celery import app
from tasks.ranges.keys import range_orphans_key
from tasks.ranges.outcomes import FencedOut
from tasks.ranges.poolexit import POOL_WATCH_S, PoolWatch, hand_back, holder_name
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import WorkRow
from tests.ranges.cluster import Platform
from tests.ranges.test_runner import plan, small, work
from tests.support.workers import wait_until

DEAD = holder_name("a@h", 4242)


def _claim(job: Any, part: int, owner: str, sessions: sessionmaker[Session],
           leases: Leases) -> int:
    """Hold `part`'s lease and claim its row as `owner`, as a run does; return the fence."""
    lease = leases.acquire(job.lease_name(part), ttl=30.0)
    assert WorkRow(job, part, sessions, owner).claim(lease.fence) is not None
    return lease.fence


def test_the_dead_process_s_partitions_go_back_fenced_and_at_once(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    job = small(cm_data)
    seed_cm_data(engine, 3000)
    plan(sessions, redis_client, job)
    fences = {part: _claim(job, part, DEAD, sessions, leases) for part in (0, 1)}
    alive = _claim(job, 2, holder_name("a@h", 4243), sessions, leases)

    parts = hand_back(sessions, leases, redis_client, job.name, DEAD, "died", ttl=60)

    assert sorted(parts) == [0, 1]
    for part in (0, 1):
        row = work(engine, part)
        assert (row.status, row.owner, row.fence, row.crashes, row.error) == (
            S.PENDING, None, fences[part], 1, "died")
        assert not redis_client.exists(f"lease:{{{job.lease_name(part)}}}")
        # The dead holder's late write is refused: the row is no longer `running`.
        with engine.begin() as conn, pytest.raises(FencedOut):
            WorkRow(job, part, sessions, DEAD).checkpoint(conn, fences[part], 1, 1, 1.0)
    assert {int(p) for p in redis_client.smembers(range_orphans_key(job.name))} == {0, 1}
    assert 0 < redis_client.ttl(range_orphans_key(job.name)) <= 60
    # The live process's partition is untouched, and a second report changes nothing.
    assert (work(engine, 2).status, work(engine, 2).fence) == (S.RUNNING, alive)
    assert hand_back(sessions, leases, redis_client, job.name, DEAD, "again", ttl=60) == []
    # The next claim takes a newer fence at once (no TTL to wait for) and counts no crash
    # twice.
    taker = leases.acquire(job.lease_name(0), ttl=30.0)
    claimed = WorkRow(job, 0, sessions, "b@h:1").claim(taker.fence)
    assert taker.fence > fences[0] and claimed is not None and claimed.crashes == 1


def test_a_partition_taken_over_meanwhile_is_left_to_its_new_holder(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    job = small(cm_data)
    seed_cm_data(engine, 1000)
    plan(sessions, redis_client, job)
    old = _claim(job, 0, DEAD, sessions, leases)
    redis_client.delete(f"lease:{{{job.lease_name(0)}}}")  # its lease lapsed meanwhile
    newer = _claim(job, 0, "b@h:1", sessions, leases)

    assert hand_back(sessions, leases, redis_client, job.name, DEAD, "died", ttl=60) == []

    row = work(engine, 0)
    assert (row.status, row.owner, row.fence) == (S.RUNNING, "b@h:1", newer)
    assert newer > old and redis_client.exists(f"lease:{{{job.lease_name(0)}}}")


def _pid_of(owner: str) -> int:
    return int(owner.rsplit(":", 1)[1])


@pytest.mark.parametrize("db_kind", ["sqlite"], indirect=True)
def test_a_write_committed_between_the_hand_back_s_read_and_its_write_does_not_fail_it(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite under WAL: a transaction that read, then writes after another connection
    committed, fails at once with "database is locked" (its snapshot is stale; the busy
    timeout does not help). The hand-back reads the dead holder's rows, then writes them: a
    reconcile round or a batch committing between the two made it fail, and the partition
    waited for the lease TTL (seen once in CI beside a loaded suite). It takes SQLite's
    write lock up front, so the other writer waits for it instead."""
    from sqlalchemy import text

    import tasks.ranges.poolexit as module

    job = small(cm_data)
    seed_cm_data(engine, 1000)
    plan(sessions, redis_client, job)
    fence = _claim(job, 0, DEAD, sessions, leases)
    wrote = threading.Event()

    def other_writer() -> None:
        with engine.begin() as conn:
            conn.execute(text("UPDATE cm_data SET payload = 'touched' WHERE id = 1"))
        wrote.set()

    real = module.hand_back_dead

    def another_write_between(session: Session, *args: Any) -> Any:
        session.execute(text("SELECT count(*) FROM work_items"))  # its read, as the real one
        writer = threading.Thread(target=other_writer)
        writer.start()
        wrote.wait(1.0)  # lands at once unless this transaction holds the write lock
        return real(session, *args)

    monkeypatch.setattr(module, "hand_back_dead", another_write_between)
    assert hand_back(sessions, leases, redis_client, job.name, DEAD, "died", ttl=60) == [0]
    assert wrote.wait(30), "the other writer never got the lock"
    row = work(engine, 0)
    assert (row.status, row.fence, row.crashes) == (S.PENDING, fence, 1)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("db_kind", ["postgresql", "sqlite"], indirect=True)
def test_a_sigkilled_pool_process_s_partition_is_taken_over_well_within_the_ttl(
    engine: Engine, platform: Callable[..., Platform]
) -> None:
    seed_cm_data(engine, 10_000)
    # LEASE_TTL 30: the lease lapsing could not explain a takeover within 10 s.
    cluster = platform(LEASE_TTL="30", CM_DATA_PARTITION_SIZE="10000",
                       CM_DATA_BATCH_SIZE="100", CM_DATA_BATCH_DELAY="0.2")
    # Held before any worker runs it: 100 batches of 100 rows cannot end before the kill lands.
    cluster.start_held(100)
    worker = cluster.worker("a")
    cluster.worker("b")
    cluster.beat()
    before = wait_until(cluster.running_with_progress, 60, "a partition in progress")
    pid = _pid_of(before.owner)
    assert pid != worker.pid  # a pool process, not a worker's main process
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    taken = wait_until(lambda: next((p for p in cluster.parts()
                                     if p.fence > before.fence and p.status == S.RUNNING
                                     and p.claims > before.claims), None),
                       25, "the partition claimed again")
    took = time.monotonic() - killed_at
    assert took < 10, f"taken over after {took:.1f} s: the lease TTL, not the hand-back"
    assert taken.crashes == 1 and taken.next_id >= before.next_id
    assert "handed back parts [0]" in "".join(p.output() for p in cluster.procs)
    # A late write of the dead process (its fence) is refused in the database.
    with engine.begin() as conn, pytest.raises(FencedOut):
        WorkRow(cm_data, 0, sessionmaker(engine), before.owner).checkpoint(
            conn, before.fence, before.next_id + 100, 100, 1.0)
    cluster.throttle(0)
    cluster.wait_finished()
    cluster.assert_exactly_once(10_000)
    assert all(p.popen.poll() is None for p in cluster.procs)  # the worker itself lived


def test_workers_reap_dead_pool_processes_on_a_short_timer() -> None:
    """The prefork pool's own timer looks for exited children every 5 s, and its sentinel
    missed about half the SIGKILLs `bench failover` made (the death seen 4.2-4.6 s late):
    every worker runs PoolWatch, which asks for exit codes four times a second."""
    import_module("tasks.ranges.tasks")  # what a worker loads: it adds the step
    assert PoolWatch in app.steps["worker"]
    assert POOL_WATCH_S <= 0.5
    assert set(PoolWatch.requires) == {"celery.worker.components:Pool",
                                       "celery.worker.components:Timer"}
