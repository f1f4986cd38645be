"""Fixtures of the range-job tests: a session factory on the test database and a lease manager
on the flushed test Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from lease import Leases


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@pytest.fixture
def leases(redis_client: redis.Redis) -> Iterator[Leases]:
    found = Leases(redis_client)
    yield found
    found.close()
