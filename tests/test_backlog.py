"""Queues you can see (tasks/worker/backlog.py): `status` shows each queue's backlog and the
age of its oldest message, on Redis and (the count) on RabbitMQ."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support import forkcli
from tests.support.brokers import platform_client
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, celery_call, platform_env

pytestmark = pytest.mark.timeout(120)


def _cli(env: dict[str, str], *args: str) -> str:
    import sys

    done = forkcli.run([sys.executable, "-m", "tasks", *args], env, ROOT, 90)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _queues(env: dict[str, str]) -> dict[str, dict[str, object]]:
    return {q["name"]: q for q in json.loads(_cli(env, "status", "--json"))["item"]["queues"]}


def test_status_shows_each_queues_backlog_and_the_age_of_its_oldest_message(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=f"sqlite:///{tmp_path}/q.db",
                       COLUMNS="160")
    _cli(env, "migrate")
    first = time.time()
    for _ in range(2):  # no worker: they wait on the default queue
        assert celery_call(env, "devtools.samples.nap", "--args", "[0]").returncode == 0
    queues = _queues(env)
    waited = time.time() - first
    assert queues["celery"]["messages"] == 2
    oldest = queues["celery"]["oldest_s"]
    assert isinstance(oldest, float) and 0 <= oldest <= waited + 0.5
    assert queues["ranges"] == {"name": "ranges", "messages": 0, "oldest_s": None}
    assert queues["control"]["messages"] == 0
    assert "queues: celery 2 (oldest " in _cli(env, "status")


def test_on_rabbitmq_status_counts_each_queue(
    private_redis: RedisServer, tmp_path: Path, amqp_url: str
) -> None:
    env = platform_env(REDIS_URL=private_redis.url, BROKER_URL=amqp_url,
                       DATABASE_URL=f"sqlite:///{tmp_path}/q.db")
    _cli(env, "migrate")
    client = platform_client(env)
    try:
        for _ in range(3):
            client.send_task("devtools.samples.nap", [0])
    finally:
        client.close()
    queues = _queues(env)
    assert queues["celery"] == {"name": "celery", "messages": 3, "oldest_s": None}
