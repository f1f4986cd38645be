"""Controls in the middle of failures (issue 11): a pause that lands while a killed worker's
partition is being taken over, and a cancel sent while Redis is flushed. Real prefork workers
and beat on PostgreSQL, a private Redis, 1.5 s leases."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from sqlalchemy import Engine, func, select

import bench.cm_data  # noqa: F401  (registers the cm_data job in this process)
from examples.seed import seed_cm_data
from tasks.ranges.tables import RunState
from tests.ranges.cluster import DATA, Platform
from tests.ranges.control_support import control_platform, idle, jobs_cli, processed, runs
from tests.support.workers import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.parametrize("db_kind", ["postgresql"])]

BATCH_S, BATCH_ROWS = 0.3, "25"  # a partition of 2,000 rows takes 24 s before the hold lands
HOLD_RATE = "100"  # rows/s: the 6,000 rows take a minute, long past the control under test


def hold_back(cluster: Platform) -> None:
    """Throttle the run, so it cannot finish before the control under test lands, however
    busy the machine (the throttle is the run's: a flushed Redis gets it back each round)."""
    throttled = jobs_cli(cluster, "throttle", "cm_data", HOLD_RATE)
    assert throttled.returncode == 0, throttled.stderr


def test_a_pause_during_a_takeover_holds_the_job_and_resume_finishes_exactly_once(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 6000)
    cluster = control_platform(platform, CM_DATA_PARTITION_SIZE="2000",
                               CM_DATA_BATCH_DELAY=str(BATCH_S), CM_DATA_BATCH_SIZE=BATCH_ROWS)
    doomed = cluster.worker("doomed")
    cluster.worker("survivor")
    cluster.beat()
    cluster.start_job()
    hold_back(cluster)
    victim = wait_until(lambda: next((p for p in cluster.parts() if p.status == "running"
                                      and (p.owner or "").startswith("doomed@")
                                      and p.next_id > p.lo), None),
                        60, "a partition in progress on the doomed worker")
    doomed.kill()
    # The lease lapses after its TTL; the reconciler then hands the partition to the survivor.
    # Pause right as that takeover is due.
    time.sleep(1.5)
    paused = jobs_cli(cluster, "pause", "cm_data")
    assert paused.returncode == 0, paused.stderr
    wait_until(lambda: idle(cluster), 40, "no partition running, no lease held")
    held = processed(engine)
    time.sleep(2)  # a few reconcile rounds: nothing is dispatched while paused
    assert processed(engine) == held and idle(cluster)
    resumed = jobs_cli(cluster, "resume", "cm_data")
    assert resumed.returncode == 0, resumed.stderr
    lifted = jobs_cli(cluster, "throttle", "cm_data", "0")
    assert lifted.returncode == 0, lifted.stderr
    cluster.wait_finished()
    cluster.assert_exactly_once(6000)
    taken = next(p for p in cluster.parts() if p.part == victim.part)
    assert taken.claims >= 2  # the victim's partition was claimed again after the kill


def test_a_cancel_sent_while_redis_is_flushed_holds_and_a_new_start_finishes_exactly_once(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 6000)
    cluster = control_platform(platform, CM_DATA_PARTITION_SIZE="2000",
                               CM_DATA_BATCH_DELAY=str(BATCH_S), CM_DATA_BATCH_SIZE=BATCH_ROWS)
    cluster.worker("a")
    cluster.worker("b")
    cluster.beat()
    cluster.start_job()
    hold_back(cluster)
    wait_until(cluster.running_with_progress, 60, "a partition in progress")
    client = redis.Redis.from_url(cluster.redis_server.url)
    client.flushall()  # leases, the control flag and the queued messages: all gone
    client.close()
    cancelled = jobs_cli(cluster, "cancel", "cm_data")
    assert cancelled.returncode == 0, cancelled.stderr
    wait_until(lambda: idle(cluster), 40, "no partition running, no lease held")
    assert runs(engine)[-1].state == RunState.CANCELLED
    held = processed(engine)
    time.sleep(2)  # the reconciler writes the cancel back to Redis and dispatches nothing
    assert processed(engine) == held
    started = jobs_cli(cluster, "start", "cm_data")
    assert started.returncode == 0, started.stderr
    wait_until(lambda: runs(engine)[-1].state == RunState.SUCCEEDED, 120, "run 2 succeeded")
    cluster.assert_exactly_once(6000)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).where(DATA.c.status == 1)).scalar() == 6000
