"""A Redis Sentinel group of private processes on loopback ports (tests only): one master, one
replica, three sentinels watching them under the name `mymaster`.

    with sentinel_group() as group:
        group.sentinel_urls      # "sentinel://127.0.0.1:p1;sentinel://127.0.0.1:p2;..."
        group.master_client()    # a client that follows the current master
        group.kill_master()      # SIGKILL the current master, wait for the sentinels' failover
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from redis.sentinel import Sentinel

from devtools.embedded import redis_binary
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer

__all__ = ["SentinelGroup", "sentinel_group", "MASTER_NAME"]

MASTER_NAME = "mymaster"


class SentinelGroup:
    def __init__(self) -> None:
        self.master = RedisServer()
        self.replica = RedisServer(None, "--replicaof", "127.0.0.1", str(self.master.port))
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.dir = Path(tempfile.mkdtemp(prefix="sentinel-test-"))

    @property
    def nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    @property
    def sentinel_urls(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    def start(self) -> SentinelGroup:
        self.master.start()
        self.replica.start()
        for i in range(len(self.sentinel_ports)):
            self.sentinels.append(self._launch(i))
        self._wait(lambda: self._relaunch_exited() and self._replica_synced()
                   and self._sentinels_see_master(),
                   "the replica synced and every sentinel watching", 60.0)
        return self

    def _launch(self, i: int) -> subprocess.Popen[bytes]:
        conf = self.dir / f"sentinel-{i}.conf"  # a sentinel rewrites its file: write it anew
        conf.write_text(
            f"port {self.sentinel_ports[i]}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
            # A split vote is retried after twice this: short, so a loaded machine still
            # elects within a lease TTL.
            f"sentinel failover-timeout {MASTER_NAME} 2000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n")
        return subprocess.Popen([redis_binary(), str(conf), "--sentinel"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _relaunch_exited(self) -> bool:
        """A sentinel whose free port another test took in the meantime exits at once: start
        it again on another port (a failed run's cause under parallel tests)."""
        for i, proc in enumerate(self.sentinels):
            if proc.poll() is not None:
                self.sentinel_ports[i] = free_port()
                self.sentinels[i] = self._launch(i)
        return True

    def sentinel(self) -> Sentinel:
        return Sentinel(self.nodes, socket_timeout=1.0)

    def master_address(self) -> tuple[str, int]:
        host, port = self.sentinel().discover_master(MASTER_NAME)
        return str(host), int(port)

    def master_client(self) -> redis.Redis:
        return self.sentinel().master_for(MASTER_NAME, socket_timeout=2.0)

    def kill_master(self, timeout: float = 60.0) -> float:
        """SIGKILL the current master; return the seconds until the sentinels name another."""
        old = self.master_address()
        victim = self.master if self.master.port == old[1] else self.replica
        started = time.monotonic()
        victim.kill()
        self._wait(lambda: self._master_is_not(old), "a new master", timeout)
        return time.monotonic() - started

    def _master_is_not(self, old: tuple[str, int]) -> bool:
        try:
            return self.master_address() != old
        except Exception:
            return False

    def _replica_synced(self) -> bool:
        try:
            info = redis.Redis(port=self.replica.port).info("replication")
        except redis.ConnectionError:
            return False
        return info.get("master_link_status") == "up"

    def _sentinels_see_master(self) -> bool:
        for port in self.sentinel_ports:
            try:
                client = redis.Redis(port=port, socket_timeout=1.0)
                master = client.sentinel_master(MASTER_NAME)
                # Each sentinel knows the others and the replica: a kill can then fail over.
                if (int(master.get("num-other-sentinels", 0)) < 2
                        or int(master.get("num-slaves", 0)) < 1):
                    return False
            except (redis.ConnectionError, redis.ResponseError):
                return False
        return True

    @staticmethod
    def _wait(predicate: object, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError(f"sentinel group: no {what} in {timeout}s")
            time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.kill()
            proc.wait()
        self.master.kill()
        self.replica.kill()


@contextmanager
def sentinel_group() -> Iterator[SentinelGroup]:
    group = SentinelGroup()
    try:
        yield group.start()
    finally:
        group.stop()
