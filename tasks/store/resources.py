"""Per-process connections: one Redis client, one lease manager, one database engine, and
what a wing keeps per process (`shared`: the restock wing's stock nodes).

Each is created on first use and forgotten in a forked child (Celery's prefork pool), so a pool
process never shares a socket with its parent and runs its own lease keeper.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import redis
import sqlalchemy
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from lease import Leases
from tasks.config.redisconn import redis_client
from tasks.config.settings import Settings

__all__ = ["Resources", "resources_for"]

T = TypeVar("T")


class Resources:
    """Lazily created connections for one `Settings`, owned by one process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._redis: redis.Redis | None = None
        self._leases: Leases | None = None
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None
        self._shared: dict[str, Any] = {}

    @property
    def redis(self) -> redis.Redis:
        with self._lock:
            if self._redis is None:
                # REDIS_URL alone, a Redis Cluster (REDIS_CLUSTER_NODES) or a Sentinel master
                # (sentinel://, SENTINEL_MASTER). Typed as redis.Redis: a RedisCluster answers
                # every command the core sends (one key, or one hash tag, per call).
                self._redis = cast(redis.Redis, redis_client(
                    self.settings.redis_url, cluster_nodes=self.settings.redis_cluster_nodes,
                    sentinel_master=self.settings.sentinel_master,
                    socket_timeout=5, socket_connect_timeout=5, health_check_interval=30,
                ))
            return self._redis

    @property
    def leases(self) -> Leases:
        client = self.redis
        with self._lock:
            if self._leases is None:
                self._leases = Leases(client)
            return self._leases

    @property
    def engine(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = make_engine(self.settings.database_url,
                                           idle_timeout=self.settings.lease_ttl,
                                           schema=self.settings.database_schema)
            return self._engine

    @property
    def sessions(self) -> sessionmaker[Session]:
        engine = self.engine
        with self._lock:
            if self._sessions is None:
                self._sessions = sessionmaker(engine, expire_on_commit=False)
            return self._sessions

    def shared(self, name: str, create: Callable[[Settings], T]) -> T:
        """This process's `name` object, made by `create(settings)` on first use and forgotten
        after a fork like every connection here (a wing's own clients: the core never imports
        the wings)."""
        with self._lock:
            if name not in self._shared:
                self._shared[name] = create(self.settings)
            return cast(T, self._shared[name])

    def forget(self) -> None:
        """Drop every connection without closing the parent's sockets (after a fork)."""
        self._lock = threading.Lock()
        if self._engine is not None:
            self._engine.dispose(close=False)
        self._redis = None
        self._leases = None
        self._engine = None
        self._sessions = None
        self._shared = {}


def make_engine(url: str, idle_timeout: float | None = None, schema: str | None = None,
                **kwargs: Any) -> Engine:
    """Create an engine that behaves the same on SQLite, PostgreSQL and MariaDB.

    `idle_timeout` (seconds; the lease TTL for workers) makes the server end a session whose
    transaction sits idle that long: a holder paused inside a batch (GC, SIGSTOP) would
    otherwise keep its row lock on the work row and block the takeover for as long as it
    sleeps. Its lease is gone by then anyway, so its batch must roll back.
    """
    if url.startswith("sqlite"):
        return _sqlite_engine(url, **kwargs)
    if url.startswith("postgresql"):
        options = _pg_options(url, idle_timeout, schema)
        if options:
            kwargs.setdefault("connect_args", {})["options"] = options
    engine = sqlalchemy.create_engine(url, pool_pre_ping=True, pool_recycle=1800, **kwargs)
    if idle_timeout is not None and engine.dialect.name in ("mysql", "mariadb"):
        seconds = max(math.ceil(idle_timeout), 1)

        @event.listens_for(engine, "connect")
        def _mariadb_timeouts(dbapi_conn: Any, _: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute(f"SET SESSION idle_write_transaction_timeout = {seconds}")
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {2 * seconds}")
            cursor.close()

    return engine


def _sqlite_engine(url: str, **kwargs: Any) -> Engine:
    """A SQLite engine: WAL, and transactions begun by SQLAlchemy (write intent: IMMEDIATE)."""
    # sqlalchemy.create_engine looked up at each call: tracing may have instrumented it.
    engine = sqlalchemy.create_engine(url, connect_args={"timeout": 30}, **kwargs)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _: Any) -> None:
        # Let SQLAlchemy, not the driver, decide where transactions begin (see below).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # SQLAlchemy, not the driver, starts transactions. A transaction that will read
        # and then write (WRITE_INTENT) takes the write lock up front, so it waits for it
        # (busy_timeout) instead of failing with SQLITE_BUSY after its read; every other
        # transaction starts deferred, so readers never wait under WAL.
        options = conn.get_execution_options()
        if options.get("isolation_level") == "AUTOCOMMIT":
            return
        # On the driver's connection: a BEGIN through SQLAlchemy's own execution costs more
        # than the transaction's usual statements.
        conn.connection.driver_connection.execute(
            "BEGIN IMMEDIATE" if options.get("write_intent") else "BEGIN")

    return engine


def _pg_options(url: str, idle_timeout: float | None, schema: str | None) -> str:
    """PostgreSQL's startup `options`: the URL's own (`?options=-csearch_path%3Dapp`) kept,
    then the schema (DATABASE_SCHEMA) first on the search path, then the timeouts."""
    given = sqlalchemy.engine.make_url(url).query.get("options")
    found = [given] if isinstance(given, str) else list(given or ())
    if schema is not None:
        found.append(f"-c search_path={schema}")
    if idle_timeout is not None:
        millis = max(int(idle_timeout * 1000), 1000)
        found.append(f"-c idle_in_transaction_session_timeout={millis} "
                     f"-c lock_timeout={2 * millis}")
    return " ".join(found)


_registry: dict[Settings, Resources] = {}


def resources_for(settings: Settings) -> Resources:
    """The process-wide `Resources` for `settings`."""
    found = _registry.get(settings)
    if found is None:
        found = _registry.setdefault(settings, Resources(settings))
    return found


def _after_fork_in_child() -> None:
    for res in _registry.values():
        res.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
