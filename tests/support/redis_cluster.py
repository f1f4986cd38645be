"""A Redis Cluster of private `redis-server` processes on loopback ports (tests only).

    with redis_cluster(masters=3) as cluster:
        client = cluster.client()          # a redis.RedisCluster
        cluster.seeds                       # "127.0.0.1:p1,127.0.0.1:p2,..."
        cluster.move_slot(slot, to_index)   # migrate a slot's keys (MIGRATE), as resharding does
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.cluster import RedisCluster

from devtools.embedded import redis_binary
from tests.support.ports import cluster_port
from tests.support.redis_server import RedisServer

__all__ = ["Cluster", "redis_cluster", "cluster_port"]


class Cluster:
    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        self.nodes = [
            RedisServer(cluster_port(), "--cluster-enabled", "yes",
                        "--cluster-node-timeout", "2000", "--cluster-config-file", "nodes.conf")
            for _ in range(masters * (1 + replicas))
        ]
        self.masters = masters
        self.replicas = replicas

    @property
    def seeds(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:self.masters])

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [redis_binary("redis-cli"), "--cluster", "create",
             *[f"127.0.0.1:{n.port}" for n in self.nodes],
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        self.wait_ok()
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            infos = [self.node_client(i).cluster("info") for i in range(len(self.nodes))]
            if all(i.get("cluster_state") == "ok" for i in infos):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ok: {infos}")
            time.sleep(0.1)

    def node_client(self, index: int) -> redis.Redis:
        return redis.Redis(port=self.nodes[index].port, decode_responses=True)

    def client(self, **kwargs: object) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **kwargs)  # type: ignore[arg-type]

    def node_id(self, index: int) -> str:
        return str(self.node_client(index).cluster("myid"))

    def owner_of(self, slot: int) -> int:
        """The index of the master that serves `slot`."""
        for i in range(self.masters):
            for start, end in self._slots_of(i):
                if start <= slot <= end:
                    return i
        raise LookupError(slot)

    def _slots_of(self, index: int) -> list[tuple[int, int]]:
        myid = self.node_id(index)
        nodes = self.node_client(index).execute_command("CLUSTER", "NODES")
        for line in str(nodes).splitlines():
            fields = line.split()
            if fields[0] == myid:
                ranges = []
                for part in fields[8:]:
                    if part.startswith("["):
                        continue
                    lo, _, hi = part.partition("-")
                    ranges.append((int(lo), int(hi or lo)))
                return ranges
        return []

    def move_slot(self, slot: int, to: int) -> int:
        """Migrate `slot` and its keys to master `to` (the steps of `redis-cli --cluster
        reshard`: IMPORTING/MIGRATING, MIGRATE in batches, SETSLOT NODE everywhere); return how
        many keys moved."""
        src = self.owner_of(slot)
        if src == to:
            return 0
        source, target = self.node_client(src), self.node_client(to)
        src_id, dst_id = self.node_id(src), self.node_id(to)
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while True:
            keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            source.execute_command("MIGRATE", "127.0.0.1", self.nodes[to].port, "", 0, 5000,
                                   "KEYS", *keys)
            moved += len(keys)
        # The target first, then the source, then the rest: the order the CLUSTER SETSLOT
        # docs give (the target propagates the new owner; a source told first leaves the
        # slot with no owner until it does). Sent in index order, a slot was once nobody's
        # when the test looked (a LookupError in one CI run), so the move also waits until
        # the target serves it.
        for i in (to, src, *(i for i in range(self.masters) if i not in (to, src))):
            self.node_client(i).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        self._wait_owner(slot, to)
        return moved

    def _wait_owner(self, slot: int, index: int, timeout: float = 10.0) -> None:
        """Until master `index` serves `slot` in its own view."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.owner_of(slot) == index:
                    return
            except LookupError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"slot {slot} not served by master {index}")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


@contextmanager
def redis_cluster(masters: int = 3, replicas: int = 0) -> Iterator[Cluster]:
    cluster = Cluster(masters, replicas)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
