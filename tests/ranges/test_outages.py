"""An outage is not a crash, and a control happens whole or not at all (in-process, on a real
Redis and real databases): a real row lock on PostgreSQL, a holder that could not hand its
partition back, a start with Redis away or a table it cannot read, a run left live while its
job was not reconciled, and an orphan someone already took."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis
from sqlalchemy import JSON, Column, Engine, Integer, MetaData, Table, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import mark_processed
from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from lease import Leases
from tasks.deadletters.store import DeadLetters
from tasks.ranges.controls import ControlRefused, Controls
from tasks.ranges.gate import Gate
from tasks.ranges.jobs import RangeJob, register
from tasks.ranges.keys import range_orphans_key, range_outage_key
from tasks.ranges.reconciler import active_jobs, repair_inactive
from tasks.ranges.runner import Outcome
from tasks.ranges.tables import RANGE_RUNS, SCHEDULES, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import WorkRow
from tasks.store.resources import make_engine
from tests.ranges.test_closing import round_now, start
from tests.ranges.test_runner import counts, plan, runner, small, work
from tests.support import forkcli
from tests.support.workers import ROOT, platform_env


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
def test_a_lock_timeout_hands_the_partition_back_and_never_counts_as_a_crash(
    engine: Engine, leases: Leases, redis_client: redis.Redis
) -> None:
    """Item 4: another transaction holds a row of the partition (`SELECT ... FOR UPDATE`)
    for longer than the worker's lock_timeout, over more runs than the redelivery cap."""
    seed_cm_data(engine, 300)
    worker_engine = make_engine(engine.url.render_as_string(False), idle_timeout=0.5)
    sessions = sessionmaker(worker_engine, expire_on_commit=False)  # lock_timeout 1 s
    job = small(batch_size=100)
    plan(sessions, redis_client, job)
    try:
        with engine.connect() as other:
            other.execute(text("SELECT id FROM cm_data WHERE id = 150 FOR UPDATE"))
            for _ in range(3):  # past the cap of 2
                outcome = runner(job, 0, sessions, leases, crash_cap=2, lease_ttl=10.0,
                                 retry_delays=(0.01,)).run()
                assert outcome == Outcome.UNAVAILABLE
                row = work(engine, 0)
                assert (row.status, row.crashes, row.next_id) == (S.PENDING, 0, 101)
                assert row.error.startswith("database unavailable (LockNotAvailable)")
            other.rollback()
        assert runner(job, 0, sessions, leases, crash_cap=2).run() == Outcome.DONE
        assert DeadLetters(sessions).list() == []
    finally:
        worker_engine.dispose()
    assert counts(engine) == {1: 300}


@pytest.mark.parametrize("marked", [True, False])
def test_a_holder_that_could_not_hand_back_for_an_outage_is_no_crash(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases,
    redis_client: redis.Redis, marked: bool
) -> None:
    """The database was away for the hand-back too, so the row stayed `running`; the holder's
    mark in Redis tells the next claim it did not die. Without the mark it is a crash."""
    seed_cm_data(engine, 100)
    job = small()
    plan(sessions, redis_client, job)
    gone = leases.acquire(job.lease_name(0), ttl=10)
    assert WorkRow(job, 0, sessions, "w:1").claim(gone.fence) is not None
    gone.release()
    if marked:
        redis_client.set(range_outage_key(job.name, 0), gone.fence, ex=60)
    outcome = runner(job, 0, sessions, leases, crash_cap=1).run()
    assert outcome == (Outcome.DONE if marked else Outcome.FAILED)
    assert counts(engine) == ({1: 100} if marked else {0: 100})


def test_a_start_with_redis_away_opens_the_run_whole_and_the_reconciler_goes_on(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """Item 12: the run, the job's schedule and the failed partitions' reset commit in one
    transaction; copying the flags and the first round are left to the reconciler."""
    seed_cm_data(engine, 300)
    away = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)

    def kick(_job: str) -> dict[str, object]:
        away.ping()  # the round needs Redis too
        return {}

    report = Controls(sessions, away, kick).start("cm_data", "test")
    assert "left to the reconciler" in report["deferred"]
    with engine.connect() as conn:
        assert conn.execute(select(RANGE_RUNS.c.state)).scalars().all() == [RunState.RUNNING]
    assert active_jobs(sessions) == ["cm_data"]
    job = small()
    assert round_now(sessions, redis_client, job).dispatched == [0]
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert round_now(sessions, redis_client, job).run == RunState.SUCCEEDED
    away.close()


GHOST = Table("ghost_rows", MetaData(), Column("id", Integer, primary_key=True),
              Column("status", Integer))  # never created
register(RangeJob(name="ghost_job", table=GHOST, where=GHOST.c.status == 0,
                  process=mark_processed))


def test_the_cli_start_with_redis_on_a_closed_port_opens_a_run_the_reconciler_will_run(
    tmp_path: Path
) -> None:
    """Item 12 as reported: `python -m tasks jobs start` with REDIS_URL on a closed port used
    to print a refusal after committing half a start. Now the start is whole (exit 0, the
    Redis steps deferred) and the job is reconciled."""
    env = platform_env(REDIS_URL="redis://127.0.0.1:1/0",
                       DATABASE_URL=f"sqlite:///{tmp_path}/t.sqlite")

    def cli(*args: str, module: str = "tasks") -> subprocess.CompletedProcess[str]:
        return forkcli.run([sys.executable, "-m", module, *args], env, ROOT, 120)

    assert cli("migrate").returncode == 0
    assert cli("--rows", "10", module="examples.seed").returncode == 0
    started = cli("jobs", "start", "cm_data")
    assert started.returncode == 0, started.stderr
    assert "cm_data run 1: running" in started.stdout and "deferred" in started.stdout
    engine = make_engine(env["DATABASE_URL"])
    try:
        with engine.connect() as conn:
            assert conn.execute(select(RANGE_RUNS.c.state)).scalar_one() == RunState.RUNNING
            assert conn.execute(select(SCHEDULES.c.active)).scalar_one()
    finally:
        engine.dispose()


def test_a_start_that_cannot_read_the_table_is_refused_and_changes_nothing(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis
) -> None:
    with pytest.raises(ControlRefused, match="start ghost_job: cannot read the ids of table "
                                             "ghost_rows"):
        Controls(sessions, redis_client, lambda _job: {}).start("ghost_job", "test")
    with engine.connect() as conn:
        assert conn.execute(select(RANGE_RUNS.c.id)).first() is None
        assert conn.execute(select(SCHEDULES.c.name)).first() is None


def test_a_job_keyed_by_a_column_that_cannot_be_ordered_is_refused_when_declared() -> None:
    """A UUID key is walked by keyset (tests/ranges/test_keys.py); a JSON one is refused."""
    table = Table("by_doc", MetaData(), Column("doc", JSON, primary_key=True),
                  Column("status", Integer))
    with pytest.raises(ValueError, match="key column 'doc' of table by_doc is JSON, which "
                                         "cannot be a range key"):
        RangeJob(name="by_doc", table=table, where=table.c.status == 0,
                 process=mark_processed, id_column="doc")


def test_the_reconciler_repairs_a_live_run_whose_job_is_not_reconciled(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 10)
    start(sessions, redis_client)
    with sessions.begin() as session:  # what a control that failed halfway once left
        session.execute(update(SCHEDULES).values(active=False))
    assert active_jobs(sessions) == []
    assert repair_inactive(sessions, [small()]) == ["cm_data"]
    assert active_jobs(sessions) == ["cm_data"]
    assert repair_inactive(sessions, [small()]) == []


def test_an_orphan_someone_already_holds_is_not_adopted(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """Item 11: the orphan's queued message reached a free worker first; adopting it would
    hand the running holder's partition back for nothing."""
    seed_cm_data(engine, 300)
    job = small(partition_size=100)
    plan(sessions, redis_client, job)
    taken = leases.acquire(job.lease_name(1), ttl=10)
    redis_client.sadd(range_orphans_key(job.name), 1)
    mine = leases.acquire(job.lease_name(0), ttl=10)
    gate = Gate(redis_client, job, 10.0, may_adopt=True)
    assert gate.before_batch(mine, 0) is None and gate.adopted is None
    assert redis_client.scard(range_orphans_key(job.name)) == 0
    taken.release()
    mine.release()
    assert CM_DATA.name == "cm_data"
