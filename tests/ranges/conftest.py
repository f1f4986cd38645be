"""Fixtures of the range-job tests: a session factory on the test database, a lease manager
on the flushed test Redis, and `platform`, which makes worker and beat processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from lease import Leases
from tests.ranges.cluster import Platform
from tests.support.redis_server import RedisServer


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@pytest.fixture
def leases(redis_client: redis.Redis) -> Iterator[Leases]:
    found = Leases(redis_client)
    yield found
    found.close()


@pytest.fixture
def platform(engine: Engine, private_redis: RedisServer) -> Iterator[Callable[..., Platform]]:
    """`platform(**env)` makes a `Platform` (env overrides its settings); all stop at the end."""
    made: list[Platform] = []

    def make(**env: str) -> Platform:
        found = Platform(engine, private_redis, **env)
        made.append(found)
        return found

    yield make
    for found in made:
        found.stop()
