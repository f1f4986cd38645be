"""Queues that cannot starve each other (issue 11): partitions on `ranges`, restock work on
`restock`, controls, reconcile rounds, health and rollback on `control`, the rest on `celery`.

The workers are the Procfile's own lines, run as they are (no Docker here).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import select

from examples.seed import seed_cm_data
from lease.keys import lease_key
from tasks.celery import configure
from tasks.config.settings import SettingsError
from tasks.ranges.keys import range_lease_name
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tasks.wings import WINGS, load_settings
from tasks.worker.queues import routing_config
from tests.support.db import DATABASES, fresh_database
from tests.support.redis_server import RedisServer
from tests.support.workers import Proc, platform_env, start_worker, wait_until
from tests.test_procfile import BIN, procfile

ALL_QUEUES = {"celery", "ranges", "control", "restock"}


def _routed(config: dict[str, Any], name: str) -> str:
    app = Celery("routing-check", set_as_current=False)
    app.conf.update(config)
    queue: str = app.amqp.router.route({}, name)["queue"].name
    app.close()
    return queue


@pytest.mark.parametrize(("task", "queue"), [
    ("tasks.ranges.run_partition", "ranges"),
    ("tasks.ranges.start", "control"),
    ("tasks.ranges.reconcile", "control"),
    ("tasks.ranges.pause", "control"),
    ("tasks.ranges.a_control_added_later", "control"),
    ("tasks.health.ping", "control"),
    ("tasks.rollback.sweep", "control"),
    ("tasks.restock.drain", "restock"),
    ("tasks.restock.place_order", "restock"),
    ("tasks.examples.order_saga", "celery"),
    ("devtools.samples.nap", "celery"),
])
def test_every_task_is_routed_to_its_queue(task: str, queue: str) -> None:
    assert _routed(configure(load_settings({})), task) == queue


def test_queue_names_come_from_the_settings() -> None:
    config = configure(load_settings({"RANGES_QUEUE": "parts", "CONTROL_QUEUE": "ops",
                                      "RESTOCK_QUEUE": "stock", "DEFAULT_QUEUE": "misc"}))
    assert _routed(config, "tasks.ranges.run_partition") == "parts"
    assert _routed(config, "tasks.ranges.pause") == "ops"
    assert _routed(config, "tasks.restock.drain") == "stock"
    assert _routed(config, "devtools.samples.nap") == "misc"
    assert {q.name for q in config["task_queues"]} == {"parts", "ops", "stock", "misc"}


@pytest.mark.parametrize("variable", ["RANGES_QUEUE", "RESTOCK_QUEUE", "CONTROL_QUEUE",
                                      "DEFAULT_QUEUE"])
def test_a_bad_queue_name_is_refused_naming_its_variable(variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        load_settings({variable: "no spaces/please"})


def _client(env: dict[str, str]) -> Celery:
    """A client that routes as the platform does (a bare Celery() would send every task to its
    default queue, `celery`)."""
    settings = load_settings(env)
    client = Celery(broker=settings.broker_url, backend=settings.result_backend,
                    set_as_current=False)
    client.conf.update(routing_config(settings, WINGS))
    return client


def _active_queues(client: Celery, worker: str) -> set[str]:
    replies = client.control.inspect(destination=[worker], timeout=5).active_queues() or {}
    return {q["name"] for q in replies.get(worker, [])}


def _running(engine: Any) -> int:
    with engine.connect() as conn:
        statuses = conn.execute(select(WORK.c.status)).scalars().all()
    return sum(1 for s in statuses if s == S.RUNNING)


@pytest.fixture
def slow_job_env(private_redis: RedisServer, tmp_path: Path) -> Any:
    """A cm_data job of 8 partitions of 10 one-second batches each (80 s of work for 2 slots),
    on PostgreSQL and a private Redis. (On SQLite a batch holds the one write lock through its
    CM_DATA_BATCH_DELAY and takes it again at once, so a control waits for the partition.)"""
    engine = fresh_database(DATABASES["postgresql"])
    url = engine.url.render_as_string(hide_password=False)
    seed_cm_data(engine, 800)
    env = platform_env(
        REDIS_URL=private_redis.url, DATABASE_URL=url, LEASE_TTL="5", RECONCILE_INTERVAL="1",
        CM_DATA_PARTITION_SIZE="100", CM_DATA_BATCH_SIZE="10", CM_DATA_BATCH_DELAY="1",
        CM_DATA_PARALLELISM="1", WORKER_CONCURRENCY="2", CONTROL_CONCURRENCY="1",
        PATH=f"{BIN}:{platform_env()['PATH']}")
    yield engine, env
    engine.dispose()


@pytest.mark.timeout(180)
def test_with_every_ranges_slot_busy_a_ping_a_drain_and_a_pause_act_at_once(
    slow_job_env: Any
) -> None:
    engine, env = slow_job_env
    lines = procfile()
    worker = Proc(["sh", "-c", lines["worker"]], env, "procfile-worker")
    control = Proc(["sh", "-c", lines["control"]], env, "procfile-control")
    client = _client(env)
    try:
        worker.wait_for("ready.", timeout=90)
        control.wait_for("ready.", timeout=90)
        names = {w for reply in client.control.ping(timeout=5) for w in reply}
        ranges_worker = next(n for n in names if n.startswith("worker-"))
        control_worker = next(n for n in names if n.startswith("control-"))
        assert _active_queues(client, ranges_worker) == {"ranges", "celery"}
        assert _active_queues(client, control_worker) == {"control", "restock"}
        client.send_task("tasks.ranges.start", ["cm_data"]).get(timeout=60)
        wait_until(lambda: _running(engine) == 2, 60, "both ranges slots busy on partitions")
        sent = time.monotonic()
        ping = client.send_task("tasks.health.ping")
        drain = client.send_task("tasks.restock.drain", [0, "q0"])
        assert ping.get(timeout=30)["status"] == "ok"
        drain.get(timeout=30)
        waited = time.monotonic() - sent
        # Each busy partition has ~10 s of batches left: behind them, this would take that long.
        assert waited < 4, f"ping and drain took {waited:.1f} s"
        assert ping.worker == drain.worker == control_worker
        assert _running(engine) == 2, "the partitions were still running meanwhile"
        # A pause sent now takes effect within one batch (1 s) plus 1 s: no partition runs
        # and no partition's lease is held, though the ranges slots were all busy.
        store = redis.Redis.from_url(env["REDIS_URL"])

        def held() -> list[int]:
            return [p for p in range(8)
                    if store.exists(lease_key(range_lease_name("cm_data", p)))]

        sent = time.monotonic()
        client.send_task("tasks.ranges.pause", ["cm_data"]).get(timeout=10)
        wait_until(lambda: _running(engine) == 0 and not held(), 10,
                   f"no partition running and no lease held after the pause: {held()}")
        stopped = time.monotonic() - sent
        store.close()
        assert stopped < 2, f"the pause took {stopped:.1f} s"
    finally:
        client.close()
        worker.stop()
        control.stop()


@pytest.mark.timeout(120)
def test_a_worker_without_queues_consumes_every_queue(worker_env: dict[str, str]) -> None:
    fresh_database(worker_env["DATABASE_URL"]).dispose()
    worker = start_worker(worker_env, 1, "plain")
    client = _client(worker_env)
    try:
        name = wait_until(lambda: [w for r in client.control.ping(timeout=2) for w in r], 30,
                          "the worker answering")[0]
        assert _active_queues(client, name) == ALL_QUEUES
        assert client.send_task("tasks.health.ping").get(timeout=60)["status"] == "ok"
        assert client.send_task("tasks.restock.drain", [0, "q0"]).get(timeout=60) is not None
        assert client.send_task("devtools.samples.nap", [0]).get(timeout=60) is not None
    finally:
        client.close()
        worker.stop()
