"""Keyed range jobs on real worker and beat processes (issue 21): a UUID-keyed and a
composite-keyed run of 20,000 rows, exactly once through a kill -9 of the worker holding a
partition and the takeover of its partition by another worker."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, func, select

from bench.keyed import JOBS, KEYED, create, seed
from tasks.ranges.tables import RANGE_RUNS, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tests import SAMPLE_MODULES
from tests.ranges.cluster import Platform
from tests.support import forkcli
from tests.support.workers import ROOT, wait_until

pytestmark = pytest.mark.timeout(180)

ROWS = 20_000
BATCH = 250


def cli(cluster: Platform, *args: str) -> None:
    """`python -m tasks jobs ARGS`, as an operator runs it (needs no worker)."""
    done = forkcli.run([sys.executable, "-m", "tasks", "jobs", *args], cluster.env, ROOT, 60)
    assert done.returncode == 0, done.stderr


def run_state(engine: Engine, job: str) -> str | None:
    with engine.connect() as conn:
        state: str | None = conn.execute(select(RANGE_RUNS.c.state).where(
            RANGE_RUNS.c.job == job).order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar()
    return state


@pytest.mark.parametrize(("db_kind", "key"), [("postgresql", "uuid"), ("mariadb", "composite"),
                                              ("sqlite", "composite")], indirect=["db_kind"])
def test_a_keyed_run_is_exactly_once_through_a_kill_9_and_a_takeover(
    engine: Engine, platform: Callable[..., Platform], key: str
) -> None:
    create(engine)
    seed(engine, ROWS)
    job = JOBS[key].name
    cluster = platform(EXTRA_TASK_MODULES=f"{SAMPLE_MODULES},bench.keyed",
                       KEYED_PARTITION_SIZE="5000", KEYED_BATCH_SIZE=str(BATCH))
    cli(cluster, "start", job)
    cli(cluster, "throttle", job, "500")  # held until the kill and the takeover have landed
    doomed = cluster.worker("a")
    cluster.beat()

    def holding() -> object:
        with engine.connect() as conn:
            return conn.execute(select(WORK.c.part).where(
                WORK.c.job == job, WORK.c.status == S.RUNNING,
                WORK.c.next_id >= WORK.c.lo + 2 * BATCH)).first()

    [part] = wait_until(holding, 60, "a partition two batches in")
    doomed.kill()  # kill -9 of the worker's whole process group, mid-partition
    cluster.worker("b")
    cli(cluster, "throttle", job, "0")
    wait_until(lambda: run_state(engine, job) == RunState.SUCCEEDED, 120,
               f"the run succeeded: {cluster.parts()}")
    with engine.connect() as conn:
        counts = dict(conn.execute(select(KEYED.c.processed_count, func.count())
                                   .group_by(KEYED.c.processed_count)).all())
        taken = conn.execute(select(WORK.c.claims, WORK.c.next_key, WORK.c.rows_done).where(
            WORK.c.job == job, WORK.c.part == part)).one()
        planned = conn.execute(select(func.count()).select_from(WORK).where(
            WORK.c.job == job)).scalar_one()
    assert counts == {1: ROWS}, counts
    assert planned == 4
    assert taken.claims >= 2 and taken.next_key is not None  # resumed from the stored cursor
