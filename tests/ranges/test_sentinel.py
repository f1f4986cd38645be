"""A range job on real workers whose leases, broker and result backend are all on a Redis
Sentinel group (one master, one replica, three sentinels): the master is SIGKILLed mid-job.

Replication is asynchronous, so lease keys (and fence counters) written just before the kill
may be missing on the promoted replica. What still gives exactly once is the database: each
acquire passes the work row's fence as its floor, so no fence repeats, and every batch commits
only under the row's current fence. The test prints how long the failover and the recovery
(the first batch committed after the kill) took.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, func, select

from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from tests.ranges.cluster import Platform
from tests.support.redis_sentinel import MASTER_NAME, sentinel_group
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(240)

DATA = CM_DATA
ROWS = 10_000


def processed(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(DATA.c.processed_count > 0))
                   .scalar_one())


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"])
def test_a_range_job_on_sentinel_survives_the_master_failing_over(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, ROWS)
    with sentinel_group() as group:
        # REDIS_URL alone: BROKER_URL and RESULT_BACKEND follow it onto the Sentinel group.
        cluster = platform(REDIS_URL=group.sentinel_urls, SENTINEL_MASTER=MASTER_NAME,
                           CM_DATA_BATCH_DELAY="0.2")
        try:
            cluster.start_held(500)  # held until the failover has landed, however busy
            cluster.worker("a")
            cluster.worker("b")
            cluster.beat()
            wait_until(cluster.running_with_progress, 90, "a partition in progress")
            at_kill = processed(engine)
            killed = time.monotonic()
            failover_s = group.kill_master()
            wait_until(lambda: processed(engine) > at_kill + 200, 120,
                       "a batch committed after the failover")
            recovered_s = time.monotonic() - killed
            cluster.throttle(0)
            cluster.wait_finished(timeout=150)
            finished_s = time.monotonic() - killed
        finally:
            cluster.stop()
    print(f"\nsentinel failover mid-job ({engine.dialect.name}): new master named after "
          f"{failover_s:.1f}s, first batch committed after the kill {recovered_s:.1f}s, "
          f"job finished {finished_s:.1f}s after the kill ({at_kill} of {ROWS} rows done "
          "before it)")
    assert at_kill < ROWS, "the kill came after the job had finished"
    cluster.assert_exactly_once(ROWS)
    assert all(p.fence >= 1 for p in cluster.parts())
