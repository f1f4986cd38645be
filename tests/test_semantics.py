"""Task semantics on real prefork workers: retry policies, the redelivery cap, expiry."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from celery import Celery
from celery.states import READY_STATES

from tasks.celery import check_time_limits, configure
from tasks.config.settings import SettingsError
from tasks.deadletters.store import DeadLetters
from tasks.wings import load_settings
from tasks.worker.base import DEAD_LETTERED
from tasks.worker.retry import RetryPolicy
from tests.support.brokers import platform_client
from tests.support.workers import start_worker, wait_until


def client_for(env: dict[str, str]) -> Celery:
    # BROKER_URL: the same tests run on RabbitMQ (tests/test_rabbitmq.py); results stay in Redis.
    return platform_client(env)


@pytest.fixture
def migrated_env(worker_env: dict[str, str]) -> dict[str, str]:
    from tests.support.db import fresh_database

    fresh_database(worker_env["DATABASE_URL"]).dispose()
    return worker_env


def test_a_retryable_error_is_retried_by_its_policy(migrated_env: dict[str, str]) -> None:
    worker = start_worker(migrated_env, 1)
    app = client_for(migrated_env)
    key = uuid.uuid4().hex
    try:
        result = app.send_task("devtools.samples.flaky", [key, 2]).get(timeout=60)
    finally:
        worker.stop()
        app.close()
    assert result == {"attempts": 3, "retries": 2}
    client = redis.Redis.from_url(migrated_env["REDIS_URL"])
    retries = client.lrange(f"sample:flaky:{key}:retries", 0, -1)
    assert [int(r) for r in retries] == [0, 1, 2]
    # Issue 9 item 12: sample keys end (a TTL), they do not pile up in the platform's Redis.
    for sample_key in (f"sample:flaky:{key}", f"sample:flaky:{key}:retries"):
        assert 0 < client.ttl(sample_key) <= 3600


def test_a_non_retryable_error_fails_at_once(migrated_env: dict[str, str]) -> None:
    worker = start_worker(migrated_env, 1)
    app = client_for(migrated_env)
    key = uuid.uuid4().hex
    try:
        result = app.send_task("devtools.samples.picky", [key])
        result.get(timeout=60, propagate=False)
        assert result.state == "FAILURE" and "is malformed" in str(result.result)
    finally:
        worker.stop()
        app.close()
    client = redis.Redis.from_url(migrated_env["REDIS_URL"])
    assert int(client.get(f"sample:picky:{key}")) == 1
    assert 0 < client.ttl(f"sample:picky:{key}") <= 3600


@pytest.mark.timeout(180)
def test_a_poison_message_stops_at_the_redelivery_cap(migrated_env: dict[str, str]) -> None:
    env = dict(migrated_env, REDELIVERY_CAP="3")
    worker = start_worker(env, 1)
    app = client_for(env)
    key = uuid.uuid4().hex
    client = redis.Redis.from_url(env["REDIS_URL"])
    try:
        result = app.send_task("devtools.samples.poison", [key])
        deadline = time.monotonic() + 150
        while result.state != DEAD_LETTERED:
            assert time.monotonic() < deadline, f"still {result.state}: {worker.output()[-3000:]}"
            time.sleep(0.3)
    finally:
        worker.stop()
        app.close()
    assert int(client.get(f"sample:poison:{key}")) == 3  # ran exactly REDELIVERY_CAP times
    from sqlalchemy.orm import sessionmaker

    from tasks.store.resources import make_engine

    engine = make_engine(env["DATABASE_URL"])
    letters = DeadLetters(sessionmaker(engine)).list("task")
    engine.dispose()
    assert [(x.ref, x.payload["task"]) for x in letters] == [(result.id, "devtools.samples.poison")]
    assert "REDELIVERY_CAP=3" in letters[0].reason


def test_a_task_that_waited_too_long_in_the_queue_is_not_started(
    migrated_env: dict[str, str],
) -> None:
    from devtools.samples import prompt

    late = prompt.apply_async()  # schedule_to_start=1.0 becomes the message's expiry
    time.sleep(1.5)
    worker = start_worker(migrated_env, 1)
    try:
        # Polled, not `get()`: the worker may store REVOKED before a result subscription
        # would start, and a pub/sub message sent before subscribing is never seen.
        try:
            wait_until(lambda: late.state in READY_STATES, 60, "the expired task's end")
        except TimeoutError as exc:
            raise AssertionError(f"{late.state}: {worker.output()[-3000:]}") from exc
        assert late.state == "REVOKED", worker.output()[-3000:]
        on_time = prompt.apply_async()
        assert on_time.get(timeout=60) == "started in time"
    finally:
        worker.stop()


def test_a_policy_that_could_outlast_the_visibility_timeout_is_refused_at_start_up() -> None:
    probe = Celery("probe", set_as_current=False)
    probe.conf.update(configure(load_settings({"VISIBILITY_TIMEOUT": "7200"})))
    from tasks.worker.base import PlatformTask

    @probe.task(name=f"probe.slow_retry.{uuid.uuid4().hex}", base=PlatformTask, shared=False,
                retry_policy=RetryPolicy(initial_interval=1, max_interval=6000,
                                         randomization=0.5))
    def slow_retry() -> None:  # pragma: no cover - never runs
        pass

    with pytest.raises(SettingsError, match="VISIBILITY_TIMEOUT"):
        check_time_limits(probe)
