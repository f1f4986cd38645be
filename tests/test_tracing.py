"""Tracing (TRACING=1, the `otel` extra) on a real prefork worker: the Celery, SQLAlchemy and
Redis instrumentations are wired in the pool process after its fork."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import SAMPLE_MODULES
from tests.support.db import fresh_database
from tests.support.workers import celery_call, start_worker

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")


def call_json(env: dict[str, str], task: str, *args: str) -> object:
    sent = celery_call(env, task, *args)
    assert sent.returncode == 0, sent.stderr
    from celery import Celery

    app = Celery(broker=env["REDIS_URL"], backend=env["REDIS_URL"], set_as_current=False)
    try:
        return app.AsyncResult(sent.stdout.strip()).get(timeout=60)
    finally:
        app.close()


@pytest.mark.timeout(120)
def test_a_pool_process_traces_its_tasks_sql_and_redis(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(worker_env, TRACING="1", TRACING_EXPORTER="console",
               EXTRA_TASK_MODULES=f"{SAMPLE_MODULES},tests.support.tracing")
    fresh_database(env["DATABASE_URL"]).dispose()
    worker = start_worker(env, 1)
    try:
        health = call_json(env, "tasks.health.ping")
        assert isinstance(health, dict) and health["status"] == "ok"
        spans = call_json(env, "tests.support.tracing.spans")
    finally:
        worker.stop()
    assert isinstance(spans, list)
    names = [s["name"] for s in spans]
    assert "run/tasks.health.ping" in names, json.dumps(names)
    assert any(s["attributes"].get("db.system") == "sqlite" for s in spans), names
    assert any(s["attributes"].get("db.system") == "redis" for s in spans), names


def test_tracing_settings_are_checked(worker_env: dict[str, str]) -> None:
    bad = celery_call(dict(worker_env, TRACING_EXPORTER="jaeger"), "tasks.health.ping")
    assert bad.returncode != 0 and "TRACING_EXPORTER" in bad.stderr
