"""Workers survive a restart of the broker Redis (issue 9 item 6).

The failure needs a worker that holds an unacknowledged acks_late message while its consumer
waits in BRPOP for the next one: one long task on a worker with two pool processes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from celery import Celery

from tests.support.db import fresh_database
from tests.support.redis_server import RedisServer
from tests.support.workers import platform_env, start_worker, wait_until


@pytest.mark.timeout(150)
def test_busy_workers_stay_up_through_a_broker_restart_and_take_new_tasks(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path}/b.sqlite"
    fresh_database(db).dispose()
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=db)
    workers = [start_worker(env, 2), start_worker(env, 2)]
    client = Celery(broker=private_redis.url, backend=private_redis.url, set_as_current=False)
    try:
        for _ in workers:
            client.send_task("devtools.samples.nap", [8])
        wait_until(lambda: sum(w.output().count("devtools.samples.nap[") for w in workers) >= 2,
                   timeout=30, what="both long tasks received")
        time.sleep(0.5)
        private_redis.kill()
        time.sleep(1.0)  # about the outage an operator's restart causes
        private_redis.start()
        for worker in workers:
            # Reconnected, or exited (the defect): either ends the wait.
            wait_until(lambda w=worker: w.output().count("Connected to redis") >= 2
                       or w.popen.poll() is not None, timeout=40, what=f"{worker.name} reconnected")
        for worker in workers:
            assert worker.popen.poll() is None, worker.output()[-3000:]
            assert "Unrecoverable error" not in worker.output()
        # New work runs on the restarted broker (4 tasks: both workers get some).
        results = [client.send_task("devtools.samples.nap", [0.05]) for _ in range(4)]
        assert [r.get(timeout=60) for r in results] == [0.05] * 4
        assert all(w.popen.poll() is None for w in workers)
    finally:
        client.close()
        for worker in workers:
            worker.stop()
