"""Pull-based scheduling on real prefork workers (tasks/ranges/pull.py, runners.py): the
broker's `ranges` queue never holds more than the job's runner bound, sampled every 0.1 s over
a whole run of 500 partitions, and every row is processed once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis
from sqlalchemy import Engine, select

from examples.seed import seed_cm_data
from tasks.ranges.tables import RANGE_RUNS, RunState
from tests.ranges.cluster import Platform
from tests.support.workers import start_worker, wait_until

pytestmark = pytest.mark.timeout(300)

RUNNERS = 4  # more than the worker's two slots: two runner messages wait queued


class QueueDepth:
    """Samples the length of the broker's `ranges` list every 0.1 s on a thread."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.samples: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self.samples.append(int(self.client.llen("ranges")))

    def close(self) -> list[int]:
        self.stop.set()
        self.thread.join(5)
        self.client.close()
        return self.samples


def run_state(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(RANGE_RUNS.c.state).order_by(RANGE_RUNS.c.id.desc())
                            .limit(1)).scalar()


@pytest.mark.parametrize("db_kind", ["sqlite"], indirect=True)
def test_the_queue_holds_no_more_than_the_runner_bound_over_a_run(
    engine: Engine, platform: Callable[..., Platform]
) -> None:
    seed_cm_data(engine, 5000)
    cluster = platform(CM_DATA_PARTITION_SIZE="10", RANGE_RUNNERS=str(RUNNERS))
    cluster.procs.append(start_worker(cluster.env, 2, "a"))  # one worker, two slots
    cluster.beat()
    depth = QueueDepth(cluster.redis_server.url)
    try:
        cluster.start_job()
        wait_until(lambda: run_state(engine) == RunState.SUCCEEDED, 240,
                   f"the run succeeded: {run_state(engine)}")
    finally:
        samples = depth.close()
    assert len(cluster.parts()) == 500
    assert samples and max(samples) <= RUNNERS, samples
    assert max(samples) >= 1  # the sampler saw the waiting runner messages
    cluster.assert_exactly_once(5000)
