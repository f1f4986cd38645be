"""Workers survive a restart of the broker Redis (issue 9 item 6), and a broker link that goes
half-open under them.

The failure needs a worker that holds an unacknowledged acks_late message while its consumer
waits in BRPOP for the next one: one long task on a worker with two pool processes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from celery import Celery

from bench.faultproxy import FaultProxy
from tests.support.db import fresh_database
from tests.support.redis_server import RedisServer, free_port
from tests.support.workers import platform_env, start_worker, stop_all, wait_until


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
        stop_all(workers)


@pytest.mark.timeout(180)
def test_a_worker_whose_broker_link_goes_half_open_comes_back_by_itself(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    """A link that dies without a reset (a NAT or load balancer forgot it): the worker's
    synchronous broker calls (the late ack of the task it just finished) must time out and
    reconnect, or its main process waits on the dead socket for ever and never consumes
    again. Seen in a randomized fault run: a worker silent for good after a black hole."""
    db = f"sqlite:///{tmp_path}/b.sqlite"
    fresh_database(db).dispose()
    proxy = FaultProxy(listen_port=free_port(), upstream_port=private_redis.port).start()
    env = platform_env(REDIS_URL=f"redis://127.0.0.1:{proxy.listen_port}/0",
                       DATABASE_URL=db)
    worker = start_worker(env, 1)
    client = Celery(broker=private_redis.url, backend=private_redis.url, set_as_current=False)
    try:
        client.send_task("devtools.samples.nap", [3])
        wait_until(lambda: "devtools.samples.nap[" in worker.output(), timeout=30,
                   what="the long task received")
        assert proxy.strand() > 0  # the task finishes into a dead link: its ack goes nowhere
        # The worker consumes again, by itself: a new task runs to the end, and it answers a
        # ping. Without socket timeouts its main process waits on the dead ack for ever.
        assert client.send_task("devtools.samples.nap", [0.05]).get(timeout=60) == 0.05
        wait_until(lambda: client.control.ping(timeout=2), timeout=60, what="a ping answered")
        assert worker.popen.poll() is None
    finally:
        client.close()
        worker.stop()
        proxy.stop()



@pytest.mark.timeout(150)
def test_the_control_plane_sends_periodic_tasks_to_the_pool_again_after_a_broker_restart(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    """The control plane drops a periodic message for the pool while the last one of its task
    is not yet acknowledged (tasks/worker/controlplane.py). A broker restart takes that last
    one with the old connection, never to be acknowledged: remembered across the restart, it
    would drop every later one of its task for good (beat's rollback sweeps, the dead-letter
    prune). The worker's only slot is held throughout, so the first one stays unacknowledged."""
    db = f"sqlite:///{tmp_path}/b.sqlite"
    fresh_database(db).dispose()
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=db)
    worker = start_worker(env, 1)
    client = Celery(broker=private_redis.url, backend=private_redis.url, set_as_current=False)
    periodic = "tasks.health.prune_dead_letters"

    def received(task_id: str) -> bool:
        return f"{periodic}[{task_id}] received" in worker.output()

    try:
        client.send_task("devtools.samples.nap", [60])
        wait_until(lambda: "devtools.samples.nap[" in worker.output(), timeout=30,
                   what="the long task holding the only slot")
        first = client.send_task(periodic, expires=120, queue="control")
        wait_until(lambda: received(first.id), timeout=30, what="the first prune at the pool")
        private_redis.kill()
        time.sleep(1.0)
        private_redis.start()
        wait_until(lambda: worker.output().count("Connected to redis") >= 2
                   or worker.popen.poll() is not None, timeout=40, what="the worker reconnected")
        assert worker.popen.poll() is None, worker.output()[-3000:]
        # The first prune went with the old connection (the restarted Redis is empty). The
        # next one reaches the pool; before the fix it was dropped as "still waiting".
        second = client.send_task(periodic, expires=120, queue="control")
        wait_until(lambda: received(second.id), timeout=40,
                   what="a prune sent after the restart reaching the pool")
    finally:
        client.close()
        worker.stop()
