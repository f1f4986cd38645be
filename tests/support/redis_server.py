"""Start a private `redis-server` on a free loopback port, to kill, pause or restart in a test."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from devtools.embedded import redis_binary
from tests.support.ports import free_port


class RedisServer:
    """One redis-server process on 127.0.0.1:`port`, with no persistence."""

    def __init__(self, port: int | None = None, *extra: str) -> None:
        self.port = port or free_port()
        # A port chosen here may be re-chosen until the server first started on it; a server
        # restarted (or given its port) keeps it.
        self._may_move = port is None
        self.dir = tempfile.mkdtemp(prefix="redis-test-")
        self.extra = extra  # more redis-server options, e.g. "--cluster-enabled", "yes"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers. Another test process may have taken
        the chosen port between the choice and the bind (each test process picks its ports
        itself): then this server exits, another one answers there, and a port of its own is
        chosen again (busy-run error: "Connection closed by server" from another test's proxy
        on that port)."""
        for _ in range(5):
            self.proc = subprocess.Popen(
                [redis_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                 "--appendonly", "no", "--dir", self.dir, *self.extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if self._answers():
                self._may_move = False
                return self
            if not self._may_move:
                raise RuntimeError(f"redis-server could not start on port {self.port}")
            self.port = free_port()
        raise RuntimeError("redis-server found no free port in 5 tries")

    def _answers(self) -> bool:
        """Whether this process's server answers on the port (False: it exited)."""
        assert self.proc is not None
        # No retries inside a call (redis-py's default backs off for seconds): this loop is
        # the retry, and it looks at the process between tries.
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=2,
                             retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + 10
        try:
            while True:
                if self.proc.poll() is not None:
                    return False
                try:
                    if int(client.info("server")["process_id"]) == self.proc.pid:
                        return True
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        self.kill()
        self.start()


@contextmanager
def redis_server(port: int | None = None) -> Iterator[RedisServer]:
    server = RedisServer(port).start()
    try:
        yield server
    finally:
        server.kill()
