"""Shared SQL helpers of every wing: the one clock of stored times, compare-and-set results,
the write-intent transaction option, and which errors are worth retrying."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy import CursorResult, Result
from sqlalchemy.exc import DBAPIError, OperationalError

__all__ = ["utcnow", "affected", "WRITE_INTENT", "is_transient", "is_redis_away"]


def utcnow() -> datetime:
    """Naive UTC now: stored the same way on all three databases."""
    return datetime.now(UTC).replace(tzinfo=None)


# Execution option for a transaction that reads, then writes: on SQLite it begins IMMEDIATE
# (takes the write lock up front, so a later write cannot fail with SQLITE_BUSY).
WRITE_INTENT = {"write_intent": True}


def affected(result: Result[Any]) -> int:
    """Rows matched by an UPDATE or DELETE (its compare-and-set outcome)."""
    return cast(CursorResult[Any], result).rowcount


def is_transient(exc: BaseException) -> bool:
    """Database errors worth retrying: a lost connection, a lock timeout, a busy SQLite file."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError)


def is_redis_away(exc: BaseException) -> bool:
    """Redis did not answer (restarting, failing over): as transient as a database that is."""
    return isinstance(exc, RedisConnectionError | RedisTimeoutError)
