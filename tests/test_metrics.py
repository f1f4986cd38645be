"""Prometheus metrics (METRICS_PORT) and JSON logs (LOG_FORMAT=json) of real worker processes.

Workers serve their own series; the shared state (partitions, runs, restock nodes, queues, dead
letters) is served by the leading beat alone (tasks/observe/state.py), so the tests that read
it start a beat with its own METRICS_PORT. tests/test_prometheus.py scrapes both with a real
Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path
from socket import gethostname
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from examples.seed import seed_cm_data
from tasks.observe.metrics import metrics_dir_root
from tasks.ranges.tables import WORK
from tasks.restock.routing import Router
from tests.ranges.cluster import Platform
from tests.support.brokers import platform_client
from tests.support.db import DATABASES, fresh_database
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.workers import (
    CELERY,
    ROOT,
    Proc,
    celery_call,
    platform_env,
    start_worker,
    wait_until,
)

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "rangekeeper.json"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def start_beat(env: dict[str, str], port: int) -> Proc:
    """A beat serving its metrics on `port`, once it leads (and so serves the shared state)."""
    beat = Proc([*CELERY, "beat", "--loglevel=INFO"], dict(env, METRICS_PORT=str(port)), "beat")
    beat.wait_for(f"metrics on http://127.0.0.1:{port}/metrics (beat)", timeout=30)
    beat.wait_for("beat: became leader", timeout=30)
    return beat


@pytest.mark.timeout(180)
def test_a_worker_exports_lease_and_range_metrics_that_move_with_the_work(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    port, beat_port = free_port(), free_port()
    env = dict(worker_env, METRICS_PORT=str(port), CM_DATA_PARTITION_SIZE="1000",
               CM_DATA_BATCH_SIZE="200", LEASE_TTL="2")
    engine = fresh_database(env["DATABASE_URL"])
    seed_cm_data(engine, 3000)
    worker = start_worker(env, 2)
    beat = start_beat(env, beat_port)
    try:
        before = wait_until(lambda: scrape(port), 30, "the metrics endpoint")
        assert value(before, "rangekeeper_lease_acquired_total") == 0
        started = celery_call(env, "tasks.ranges.start", "--args", '["cm_data"]')
        assert started.returncode == 0, started.stderr

        def all_done() -> bool:
            with engine.connect() as conn:
                return conn.execute(select(func.count()).where(
                    WORK.c.job == "cm_data", WORK.c.status == "done")).scalar() == 3

        wait_until(all_done, 90, "three partitions done")

        def released() -> Samples | None:
            samples = scrape(port)
            ran = value(samples, "rangekeeper_task_runtime_seconds_count",
                        task="tasks.ranges.run_partition")
            released = value(samples, "rangekeeper_lease_released_total")
            return samples if released >= 3 and ran >= 1 else None

        after = wait_until(released, 30, "the releases counted")
        state = wait_until(lambda: scrape(beat_port), 30, "beat's metrics")
        pid_dir = metrics_dir_root() / f"worker-{worker.pid}"
        assert pid_dir.is_dir() and any(pid_dir.iterdir())  # the pool processes' files
    finally:
        beat.stop()
        worker.stop()
        engine.dispose()
    # one lease per partition (plus the reconcile rounds' own leases, if any)
    assert value(after, "rangekeeper_lease_acquired_total") >= 3
    assert value(after, "rangekeeper_lease_lost_total", reason="expired") == 0
    # The shared state comes from the leading beat, and from no worker.
    assert value(state, "rangekeeper_range_partitions", range_job="cm_data", state="done") == 3
    assert not any(name.startswith(("rangekeeper_range_partitions", "rangekeeper_queue_",
                                    "rangekeeper_dead_letters", "rangekeeper_restock_node"))
                   for name, _labels in after)
    # One series per run state, 1 for the run's (running until beat's round settles it)
    run_state = {s: value(state, "rangekeeper_range_run_state", range_job="cm_data", state=s)
                 for s in ("running", "paused", "cancelled", "succeeded", "failed")}
    assert sorted(run_state.values()) == [0, 0, 0, 0, 1], run_state
    assert run_state["running"] + run_state["succeeded"] == 1, run_state
    assert value(state, "rangekeeper_range_rows_done", range_job="cm_data") == 3000
    # counted by the pool processes batch by batch: exactly the job's rows
    assert value(after, "rangekeeper_range_rows_processed_total", range_job="cm_data") == 3000
    assert value(after, "rangekeeper_range_batches_total", range_job="cm_data") >= 15
    assert value(after, "rangekeeper_range_batch_seconds_count", range_job="cm_data") == \
        value(after, "rangekeeper_range_batches_total", range_job="cm_data")
    # the partitions ran in the pool (a runner task claims partitions until none is left),
    # each runner task timed once it ended, none failed
    assert value(after, "rangekeeper_task_runtime_seconds_count",
                 task="tasks.ranges.run_partition") >= 1
    assert value(after, "rangekeeper_task_failures_total", task="tasks.ranges.run_partition") == 0
    assert value(state, "rangekeeper_restock_node_up", node="0") == 1
    assert not pid_dir.exists()  # removed at shutdown
    exported = {name for name, _labels in (*after, *state)}
    assert dashboard_metrics() - exported == set()


@pytest.mark.timeout(120)
def test_a_restock_sync_and_drain_move_the_restock_metrics_by_the_entries_drained(
    worker_env: dict[str, str]
) -> None:
    """Three orders' entries on one shard queue (two unpaid, one paid): the unsynced log, the
    delay queue and its due entries are read at scrape time; the drain counts two SUCCESS and
    one PAID on that node and queue, and nothing anywhere else."""
    port, beat_port = free_port(), free_port()
    # beat serves the restock state; its own restock ticks are an hour away
    env = dict(worker_env, METRICS_PORT=str(port), RESTOCK_SHARDS="4", RESTOCK_QUEUES="2",
               RESTOCK_DELAY="1", RESTOCK_BATCH="2", RESTOCK_INTERVAL="3600")
    fresh_database(env["DATABASE_URL"]).dispose()
    router = Router(shards=4, queues=("q0", "q1"))
    node, queue = str(router.shard_for("sku-m")), router.queue_for("m-1")
    worker = start_worker(env, 2)
    beat = start_beat(env, beat_port)
    app = platform_client(env)

    def call(task: str, *args: Any) -> Any:
        return app.send_task(f"tasks.restock.{task}", args=args).get(timeout=30)

    def entries(samples: Samples) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: v for (name, labels), v in samples.items()
                if name == "rangekeeper_restock_entries_total" and v}

    try:
        before = wait_until(lambda: scrape(port), 30, "the metrics endpoint")
        assert entries(before) == {}
        assert value(before, "rangekeeper_restock_entries_total", node=node, queue=queue,
                     status="SUCCESS") == 0  # the series exists before the first drain
        call("define_sku", "sku-m", 10)
        for order, qty in (("o-1", 2), ("o-2", 1), ("o-3", 3)):
            call("place_order", order, "m-1", [[f"i-{order}", "sku-m", qty]])
        call("pay", "o-3")
        where = {"node": node, "queue": queue}
        logged = scrape(beat_port)
        assert value(logged, "rangekeeper_restock_unsynced_log_entries", **where) == 3
        assert value(logged, "rangekeeper_restock_queued", **where) == 0
        assert call("sync", int(node), queue)["moved"] == 3
        synced = scrape(beat_port)
        assert value(synced, "rangekeeper_restock_unsynced_log_entries", **where) == 0
        assert value(synced, "rangekeeper_restock_queued", **where) == 3
        wait_until(lambda: value(scrape(beat_port), "rangekeeper_restock_due", **where) == 3,
                   10, "the three entries due")
        report = call("drain", int(node), queue)
        assert report["outcome"] == "drained" and report["batches"] == 2, report
        after = scrape(port)
        state = scrape(beat_port)
        assert call("inspect", "sku-m")["redis_stock"] == 10 - 3  # o-1 and o-2 came back
    finally:
        beat.stop()
        worker.stop()
        app.close()
    assert report["statuses"] == {"SUCCESS": 2, "PAID": 1}
    drained = entries(after)
    assert drained == {(("node", node), ("queue", queue), ("status", "SUCCESS")): 2,
                       (("node", node), ("queue", queue), ("status", "PAID")): 1}
    assert sum(drained.values()) == sum(report["statuses"].values())
    assert value(state, "rangekeeper_restock_queued", **where) == 0
    assert value(state, "rangekeeper_restock_due", **where) == 0
    assert after[("rangekeeper_restock_dead_letters_total", tuple(sorted(where.items())))] == 0


def dashboard_metrics() -> set[str]:
    """Every metric name the Grafana dashboard queries."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    names = {name for expr in exprs for name in re.findall(r"rangekeeper_[a-z_]+", expr)}
    assert len(names) >= 20, names
    return names


def test_metrics_are_off_without_a_port_and_bad_settings_are_refused(
    worker_env: dict[str, str]
) -> None:
    bad = celery_call(dict(worker_env, METRICS_PORT="99999"), "tasks.health.ping")
    assert bad.returncode != 0 and "METRICS_PORT='99999' must be a TCP port" in bad.stderr
    bad = celery_call(dict(worker_env, METRICS_ADDRESS="everywhere"), "tasks.health.ping")
    assert bad.returncode != 0 and "METRICS_ADDRESS='everywhere'" in bad.stderr
    bad = celery_call(dict(worker_env, LOG_FORMAT="xml"), "tasks.health.ping")
    assert bad.returncode != 0 and "LOG_FORMAT" in bad.stderr


@pytest.mark.timeout(120)
def test_json_logs_carry_the_task_and_never_a_password(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(private_redis.url)
    client.config_set("requirepass", "redis-pw-3141")
    client.close()
    redis_url = f"redis://:redis-pw-3141@127.0.0.1:{private_redis.port}/0"
    # PostgreSQL here trusts loopback, so the password is carried but not checked.
    db_url = make_url(DATABASES["postgresql"]).set(password="db-pw-2718")
    fresh_database(db_url.render_as_string(hide_password=False)).dispose()
    env = platform_env(REDIS_URL=redis_url, DATABASE_URL=db_url.render_as_string(False),
                       LOG_FORMAT="json")
    worker = start_worker(env, 1)
    try:
        ping = celery_call(env, "tasks.health.ping")
        assert ping.returncode == 0, ping.stderr
        task_id = ping.stdout.strip()
        worker.wait_for(f'"task_id": "{task_id}"', timeout=30)
        log = worker.output()
    finally:
        worker.stop()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert records and all({"time", "level", "name", "message"} <= r.keys() for r in records)
    mine = [r for r in records if r.get("task_id") == task_id]
    assert mine and all(r["task_name"] == "tasks.health.ping" for r in mine)
    assert "redis-pw-3141" not in log and "db-pw-2718" not in log


@pytest.mark.timeout(180)
def test_a_takeover_after_kill_9_is_counted_on_the_survivor(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    engine = fresh_database(DATABASES["postgresql"])  # SQLite: one writer at a time
    seed_cm_data(engine, 2000)
    platform = Platform(engine, private_redis, CM_DATA_PARTITION_SIZE="1000",
                        CM_DATA_BATCH_SIZE="100", CM_DATA_BATCH_DELAY="0.3")
    ports = [free_port(), free_port()]
    try:
        platform.start_held(100)  # held until the kill has landed, however busy the machine
        workers = [start_worker(dict(platform.env, METRICS_PORT=str(port)), 1, f"m{i}")
                   for i, port in enumerate(ports)]
        platform.procs.extend(workers)
        platform.beat()

        def both_running() -> bool:
            return sum(p.status == "running" and p.next_id > p.lo for p in platform.parts()) == 2

        wait_until(both_running, 60, f"both partitions running: {platform.parts()}")
        workers[0].kill()
        platform.throttle(0)
        platform.wait_finished(120)
        survivor = scrape(ports[1])
    finally:
        platform.stop()
    try:
        platform.assert_exactly_once(2000)
    finally:
        engine.dispose()  # after the last query: a connection made after it would leak
    assert value(survivor, "rangekeeper_range_takeovers_total", range_job="cm_data") == 1
    assert value(survivor, "rangekeeper_range_rows_processed_total", range_job="cm_data") > 1000


@pytest.mark.timeout(90)
def test_a_second_worker_on_the_same_metrics_port_exits_with_one_line(
    worker_env: dict[str, str]
) -> None:
    """Two workers on one host with one METRICS_PORT: the first says where its metrics are,
    the second exits non-zero at start with one line naming METRICS_PORT, and never runs
    without metrics."""
    port = free_port()
    env = dict(worker_env, METRICS_PORT=str(port))
    first = start_worker(env, 1, "first")
    try:
        assert f"metrics on http://127.0.0.1:{port}/metrics (worker)" in first.output()
        second = subprocess.run(
            [*CELERY, "worker", "-P", "prefork", "-c", "1", "-n", "second@%h",
             "--loglevel=INFO", "--without-mingle", "--without-gossip"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert value(scrape(port), "rangekeeper_worker_up", worker=f"first@{gethostname()}",
                     queue="ranges") == 1  # the first one's, still served
    finally:
        first.stop()
    assert second.returncode != 0
    errors = [line for line in second.stderr.splitlines() if "METRICS_PORT" in line]
    assert errors == [f"worker: METRICS_PORT={port}: cannot serve metrics on 127.0.0.1:{port} "
                      "(Address already in use); each worker and beat on one host needs its "
                      "own METRICS_PORT"], second.stderr
    assert "Traceback" not in second.stderr and "ready." not in second.stdout + second.stderr
