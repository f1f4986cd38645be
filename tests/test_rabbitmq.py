"""The broker matrix's second column: real-worker tests of task semantics, range jobs and time
limits, run again with BROKER_URL on RabbitMQ (a fresh vhost per test; results stay in Redis).

The test functions are the Redis suite's own, imported here so pytest collects them a second
time; the fixtures below override the Redis ones to point every process at RabbitMQ. The subset
(the suite has a 15-minute budget):

- task semantics (tests/test_semantics.py): a retry policy's countdowns, a non-retryable error,
  the poison message stopping at REDELIVERY_CAP;
- range jobs (tests/ranges): kill -9 of a worker mid-partition and SIGTERM handover, each
  exactly once, and the poison partition failed and dead-lettered after the cap (SQLite only;
  the databases are the same code on either broker);
- time limits (tests/rollback/test_workers.py): the hard limit and the soft limit.

On AMQP a message whose worker died comes back at once with the `redelivered` flag, which the
redelivery cap counts (tasks/worker/base.py), so the cap needs no visibility timeout to act; the
last
test shows the count going up on a whole worker's death, where Redis would wait an hour.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy.orm import sessionmaker

from tasks.config.settings import SettingsError
from tasks.deadletters.store import DeadLetters
from tasks.store.resources import make_engine
from tasks.wings import load_settings
from tasks.worker.base import DEAD_LETTERED
from tasks.worker.keys import deliveries_key
from tests.ranges.cluster import Platform
from tests.ranges.test_chaos import (
    test_kill_9_of_a_worker_resumes_its_partition_elsewhere,
    test_sigterm_hands_the_partition_over_without_waiting_for_the_ttl,
)
from tests.ranges.test_guarantees_workers import (
    test_a_poison_partition_is_failed_and_dead_lettered_after_the_cap,
)
from tests.rollback.platform import Platform as RollbackPlatform
from tests.rollback.test_workers import (
    test_the_soft_limit_rolls_back_before_the_failure_is_recorded,
    test_the_sweeper_rolls_back_a_task_killed_by_its_hard_time_limit,
)
from tests.support.brokers import platform_client
from tests.support.db import fresh_database
from tests.support.redis_server import RedisServer
from tests.support.workers import start_worker, wait_until
from tests.test_semantics import (
    migrated_env,
    test_a_non_retryable_error_fails_at_once,
    test_a_poison_message_stops_at_the_redelivery_cap,
    test_a_retryable_error_is_retried_by_its_policy,
)

# Collected here a second time, on RabbitMQ (migrated_env: the semantics tests' fixture).
__all__ = [
    "migrated_env",
    "test_a_retryable_error_is_retried_by_its_policy",
    "test_a_non_retryable_error_fails_at_once",
    "test_a_poison_message_stops_at_the_redelivery_cap",
    "test_kill_9_of_a_worker_resumes_its_partition_elsewhere",
    "test_sigterm_hands_the_partition_over_without_waiting_for_the_ttl",
    "test_a_poison_partition_is_failed_and_dead_lettered_after_the_cap",
    "test_the_sweeper_rolls_back_a_task_killed_by_its_hard_time_limit",
    "test_the_soft_limit_rolls_back_before_the_failure_is_recorded",
]

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def worker_env(worker_env: dict[str, str], amqp_url: str) -> dict[str, str]:
    """The Redis suite's worker environment with the broker moved to RabbitMQ."""
    return dict(worker_env, BROKER_URL=amqp_url)


@pytest.fixture
def db_kind(request: pytest.FixtureRequest) -> str:
    """One database on this broker (SQLite), whatever the Redis suite parametrizes."""
    return "sqlite"


@pytest.fixture
def platform(private_redis: RedisServer, amqp_url: str, tmp_path: Path,
             request: pytest.FixtureRequest) -> Iterator[object]:
    """The range tests' `platform(**env)` factory, or the rollback tests' platform, on AMQP."""
    if request.function.__module__.startswith("tests.rollback"):
        engine = fresh_database(f"sqlite:///{tmp_path}/platform.sqlite")
        found = RollbackPlatform(engine, private_redis)
        found.env["BROKER_URL"] = amqp_url
        found.client.close()
        found.client = platform_client(dict(found.env))
        yield found
        found.close()
        engine.dispose()
        return
    made: list[Platform] = []

    def make(**env: str) -> Platform:
        found = Platform(request.getfixturevalue("engine"), private_redis,
                         BROKER_URL=amqp_url, **env)
        made.append(found)
        return found

    yield make
    for found in made:
        found.stop()


def test_a_whole_worker_killed_mid_task_hands_its_message_back_at_once(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """The difference between the brokers: kill -9 of the whole worker (not only its pool
    process) returns the unacknowledged message at once on AMQP, marked redelivered, and the
    next worker's run is counted against REDELIVERY_CAP."""
    fresh_database(worker_env["DATABASE_URL"]).dispose()
    doomed = start_worker(worker_env, 1, "doomed")
    app = platform_client(worker_env)
    client = redis.Redis.from_url(worker_env["REDIS_URL"])
    try:
        result = app.send_task("devtools.samples.nap", [4.0])
        wait_until(lambda: result.state == "STARTED", 60, "the nap to start")
        doomed.kill()
        killed_at = time.monotonic()
        survivor = start_worker(worker_env, 1, "survivor")
        try:
            assert result.get(timeout=60) == 4.0
        finally:
            survivor.stop()
    finally:
        doomed.stop()
        app.close()
    # Redelivered well within a minute (the Redis transport: VISIBILITY_TIMEOUT, 2 h here).
    assert time.monotonic() - killed_at < 60
    assert int(client.get(deliveries_key(result.id)) or 0) == 1
    assert "delivery 2 of at most" in survivor.log.read_text()


def _queues(amqp_url: str) -> dict[str, tuple[str, str]]:
    """name -> (type, arguments) of every queue on the test's vhost, as RabbitMQ reports them."""
    vhost = amqp_url.rsplit("/", 1)[1]
    listed = subprocess.run(["rabbitmqctl", "-q", "list_queues", "-p", vhost, "--no-table-headers",
                             "name", "type", "arguments"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t") for line in listed.stdout.splitlines() if line.strip()]
    return {row[0]: (row[1], row[2]) for row in rows}


@pytest.mark.timeout(180)
def test_the_queues_are_quorum_queues_and_the_cap_acts_below_their_delivery_limit(
    migrated_env: dict[str, str], amqp_url: str
) -> None:
    """A poison message with REDELIVERY_CAP=3 on a quorum queue whose delivery limit is 4 (the
    smallest the settings accept): the platform's cap dead-letters it into the database on its
    fourth delivery, before RabbitMQ would drop it after a fifth."""
    env = dict(migrated_env, REDELIVERY_CAP="3", AMQP_DELIVERY_LIMIT="4")
    worker = start_worker(env, 1)
    app = platform_client(env)
    key = uuid.uuid4().hex
    try:
        queue_type, arguments = _queues(amqp_url)["celery"]
        assert queue_type == "quorum"
        assert "x-delivery-limit" in arguments and "4" in arguments, arguments
        result = app.send_task("devtools.samples.poison", [key])
        wait_until(lambda: result.state == DEAD_LETTERED, 150,
                   f"the poison message dead-lettered: {worker.output()[-2000:]}")
    finally:
        worker.stop()
        app.close()
    client = redis.Redis.from_url(env["REDIS_URL"])
    assert int(client.get(f"sample:poison:{key}")) == 3
    engine = make_engine(env["DATABASE_URL"])
    letters = DeadLetters(sessionmaker(engine)).list("task")
    engine.dispose()
    assert [x.ref for x in letters] == [result.id]


def test_a_delivery_limit_at_or_below_the_cap_is_refused() -> None:
    with pytest.raises(SettingsError, match="AMQP_DELIVERY_LIMIT"):
        load_settings({"REDELIVERY_CAP": "5", "AMQP_DELIVERY_LIMIT": "5"})
