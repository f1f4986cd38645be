"""Shared SQL helpers of every wing: the one clock of stored times, compare-and-set results,
the write-intent transaction option, which errors are worth retrying, and sessions that
share one connection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy import CursorResult, Engine, Result, Table, insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["utcnow", "affected", "WRITE_INTENT", "is_transient", "is_redis_away",
           "one_connection", "pooled", "NestedSession", "insert_many"]


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


class NestedSession(RuntimeError):
    """A session opened while another one's transaction is open on the shared connection."""


class _Shared(sessionmaker[Session]):
    """A sessionmaker bound to one connection: its sessions run one after another, each its
    own transaction (begun by the session, committed or rolled back when it ends). A session
    opened inside another would join the outer transaction and be undone with it, so it is
    refused.

    On PostgreSQL a session made by calling it (a read; every write goes through `begin()`)
    runs each statement in a transaction of its own (AUTOCOMMIT): under READ COMMITTED a
    read transaction's statements each take their own snapshot anyway, and this saves the
    BEGIN and ROLLBACK round trips around them."""

    def __call__(self, **local_kw: Any) -> Session:
        return self._made(_READ if self._reads_autocommit else None, local_kw)

    @contextmanager  # type: ignore[override]
    def begin(self) -> Iterator[Session]:
        with self._made(None, {}) as session, session.begin():
            yield session

    @property
    def _reads_autocommit(self) -> bool:
        return bool(self.kw["bind"].dialect.name == "postgresql")

    def _made(self, isolation: str | None, local_kw: dict[str, Any]) -> Session:
        conn = self.kw["bind"]
        if conn.in_transaction():
            raise NestedSession("a session opened inside another on a shared connection")
        conn.execution_options(isolation_level=isolation or conn.default_isolation_level)
        return super().__call__(**local_kw)


_READ = "AUTOCOMMIT"


@contextmanager
def one_connection(sessions: sessionmaker[Session]) -> Iterator[sessionmaker[Session]]:
    """Sessions like `sessions`' that all use one connection, checked out once: a reconcile
    round opens several sessions a job, and on PostgreSQL and MariaDB each checkout costs a
    round trip (the pool's pre-ping). SQLite keeps a checkout per session: its BEGIN follows
    each session's write intent, which would stick to a shared connection."""
    bind = sessions.kw.get("bind")
    if not isinstance(bind, Engine) or bind.dialect.name == "sqlite":
        yield sessions
        return
    with bind.connect() as conn:
        yield _Shared(**{**sessions.kw, "bind": conn})


def pooled(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    """`sessions`, or when they share one connection, sessions of its engine's pool (for
    work on several connections at once)."""
    if isinstance(sessions, _Shared):
        return sessionmaker(**{**sessions.kw, "bind": sessions.kw["bind"].engine})
    return sessions


def insert_many(session: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    """Insert `rows` (dicts with the same keys) into `table` in the session's transaction.

    On PostgreSQL through psycopg 3 they go by `COPY ... FROM STDIN`: a plan of 100,000
    partitions is 100,000 rows, and an INSERT of many VALUES costs SQLAlchemy and the server
    several times as much. Columns left out get their scalar default, as an INSERT gives
    them; the table's name comes from code, never from input."""
    if not rows:
        return
    conn = session.connection()
    if conn.dialect.name != "postgresql" or conn.dialect.driver != "psycopg":
        session.execute(insert(table), rows)
        return
    given = list(rows[0])
    defaults = {c.name: getattr(c.default, "arg", None) for c in table.c if c.name not in given
                and c.default is not None and getattr(c.default, "is_scalar", False)}
    quote = conn.dialect.identifier_preparer.quote
    statement = (f"COPY {quote(table.name)} ({', '.join(map(quote, [*given, *defaults]))}) "
                 "FROM STDIN")
    tail = list(defaults.values())
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row([*(row[name] for name in given), *tail])
