"""A throwaway Redis Cluster for benchmarks: N redis-server masters on loopback, no replicas.

    with bench_cluster(masters=3) as cluster:
        client = cluster.client()               # a redis.RedisCluster
        cluster.assign(slot, master_index)      # put an empty slot on a master
        cluster.owner(slot)                     # the master index serving a slot

Slots are spread evenly (CLUSTER ADDSLOTSRANGE), so one master works too (redis-cli
--cluster create wants three). Needs `redis-server` (7+) on PATH.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.cluster import ClusterNode, RedisCluster

from devtools.embedded import redis_binary

__all__ = ["BenchCluster", "bench_cluster"]

SLOTS = 16384


def _port_pair() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 >= 65536:
            continue
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class BenchCluster:
    def __init__(self, masters: int) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self.dir = tempfile.mkdtemp(prefix="bench-cluster-")
        self.ports = [_port_pair() for _ in range(masters)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> BenchCluster:
        if shutil.which(redis_binary()) is None:
            raise RuntimeError("redis-server is not on PATH")
        for port in self.ports:
            self.procs.append(subprocess.Popen(
                [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--cluster-enabled", "yes", "--dir", self.dir,
                 "--cluster-config-file", f"nodes-{port}.conf"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        nodes = [self.node(i) for i in range(len(self.ports))]
        self._wait(lambda: all(self._pings(n) for n in nodes), "every node up")
        size = SLOTS // len(nodes)
        for i, node in enumerate(nodes):
            last = SLOTS - 1 if i == len(nodes) - 1 else (i + 1) * size - 1
            node.execute_command("CLUSTER", "ADDSLOTSRANGE", i * size, last)
            if i:
                node.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])
        self._wait(lambda: all(n.cluster("info")["cluster_state"] == "ok" for n in nodes)
                   and all(len(n.cluster("nodes")) == len(nodes) for n in nodes),
                   "the cluster state ok")
        return self

    def node(self, index: int) -> redis.Redis:
        return redis.Redis(port=self.ports[index], decode_responses=True)

    def client(self, **kwargs: object) -> RedisCluster:
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in self.ports],
                            **kwargs)  # type: ignore[arg-type]

    def owner(self, slot: int) -> int:
        """The index of the master serving `slot`."""
        for start, end, primary, *_ in self.node(0).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return self.ports.index(int(primary[1]))
        raise LookupError(slot)

    def assign(self, slot: int, to: int) -> None:
        """Put `slot` (holding no keys) on master `to`, as a resharding step would."""
        target = self.node(to).cluster("myid")
        for i in range(len(self.ports)):
            self.node(i).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target)
        self._wait(lambda: all(self._sees(i, slot, to) for i in range(len(self.ports))),
                   f"slot {slot} on master {to}")

    def _sees(self, index: int, slot: int, to: int) -> bool:
        for start, end, primary, *_ in self.node(index).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1]) == self.ports[to]
        return False

    @staticmethod
    def _pings(node: redis.Redis) -> bool:
        try:
            return bool(node.ping())
        except redis.ConnectionError:
            return False

    @staticmethod
    def _wait(check: object, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError(f"bench cluster: no {what} in {timeout}s")
            time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def bench_cluster(masters: int = 3) -> Iterator[BenchCluster]:
    cluster = BenchCluster(masters)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
