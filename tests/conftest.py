"""Shared fixtures: a real, flushed Redis and private redis-server processes.

A missing service fails the run instead of skipping: CI starts every service first.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator

import pytest
import redis

from tests import WORKER_REDIS_URL
from tests.support.redis_server import RedisServer, redis_server

# A suite started from a script as a background job (`cmd &` without job control) inherits
# SIGINT ignored, and so would every process a test starts: the tests that stop a `--watch`
# or the demo with Ctrl-C (SIGINT) would wait for them for ever. Python's own handler here
# gives the children SIGINT's default again, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Tests use their own logical database so a developer's db 0 is left alone.
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/9")


@pytest.fixture(scope="session", autouse=True)
def _own_databases() -> None:
    """This process's PostgreSQL and MariaDB databases exist (one pair per xdist worker)."""
    from tests.support.db import ensure_databases

    ensure_databases()


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect garbage after each test, so a connection a test left open warns (and fails)
    in that test's teardown, not in whichever test the collector happens to run next."""
    yield
    gc.collect()


@pytest.fixture
def redis_url() -> str:
    return TEST_REDIS_URL


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
def amqp_url() -> Iterator[str]:
    """A RabbitMQ broker URL on a fresh vhost (deleted after): the broker matrix's second
    broker (tests/support/brokers.py). Skips, saying why, only where RabbitMQ is absent."""
    from tests.support.brokers import rabbit_vhost, rabbitmq_missing

    if reason := rabbitmq_missing():
        pytest.skip(reason)
    with rabbit_vhost() as url:
        yield url



@pytest.fixture
def worker_env(tmp_path: object) -> dict[str, str]:
    """Environment for real worker subprocesses: a flushed broker db and a fresh SQLite file."""
    from tests.support.workers import platform_env

    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    return platform_env(REDIS_URL=WORKER_REDIS_URL, DATABASE_URL=f"sqlite:///{tmp_path}/t.sqlite")


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def db_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def db_url(db_kind: str, tmp_path: object) -> str:
    from pathlib import Path

    from tests.support.db import database_url

    return database_url(db_kind, Path(str(tmp_path)))


@pytest.fixture
def engine(db_url: str) -> Iterator[object]:
    from tests.support.db import fresh_database

    eng = fresh_database(db_url)
    yield eng
    eng.dispose()
