"""Fixtures for the rollback tests: a journal on a fresh SQLite file and the test Redis; a
platform of real workers on a private Redis."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker

import tasks.rollback.tasks  # noqa: F401  (installs the rollback hooks, as a worker's import does)
from lease import Leases
from tasks.rollback.api import set_journal
from tasks.rollback.journals import Journal
from tasks.worker.retry import RetryPolicy
from tests.rollback.platform import Platform
from tests.support.db import fresh_database
from tests.support.redis_server import RedisServer

# Fast inline retries: 3 retries, a few milliseconds apart.
FAST = RetryPolicy(max_retries=3, initial_interval=0.005, max_interval=0.01, randomization=0.0)


@contextmanager
def process_journal(engine: Engine, client: redis.Redis) -> Iterator[Journal]:
    """This process's journal on `engine` and `client` (2 s leases, fast retries) while the
    block runs."""
    leases = Leases(client)
    found = Journal(sessionmaker(engine, expire_on_commit=False), leases, lease_ttl=2.0,
                    policy=FAST)
    set_journal(found)
    try:
        yield found
    finally:
        set_journal(None)
        leases.keeper.stop()


@pytest.fixture
def journal(tmp_path: Path, redis_client: redis.Redis) -> Iterator[Journal]:
    """The process journal, on a fresh SQLite database and the flushed test Redis."""
    engine = fresh_database(f"sqlite:///{tmp_path}/journal.sqlite")
    with process_journal(engine, redis_client) as found:
        yield found
    engine.dispose()


@pytest.fixture
def platform(tmp_path: Path, private_redis: RedisServer) -> Iterator[Platform]:
    engine = fresh_database(f"sqlite:///{tmp_path}/platform.sqlite")
    found = Platform(engine, private_redis)
    yield found
    found.close()
    engine.dispose()
