"""Where the logical stock shards live: one StockNode per shard, on its master's client.

Shard N (hash tag ``{stock:N}``, N < RESTOCK_SHARDS) is served by the client of master
N % masters, the masters being RESTOCK_REDIS_URLS (default: REDIS_URL alone):

- one Redis: every shard on it (the embedded default);
- a Redis Cluster: one cluster client serves every shard; the cluster puts each shard's slot
  on one of its masters and moves it with its own resharding (the client follows MOVED/ASK);
- Sentinel or several plain masters: shard N on master N % masters.

Shards of one master share its client, its script set and its lease manager, so a process
holds one connection pool and one lease keeper per master, never one per shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lease import Leases
from tasks.config.settings import Settings
from tasks.restock.scripts import StockScripts
from tasks.restock.settings import restock_settings
from tasks.store.resources import Resources

__all__ = ["StockNode", "close_shards", "connect_shards", "master_clients", "master_of",
           "stock_nodes"]


@dataclass
class StockNode:
    """Everything that talks to shard `redis_id` (the name predates shards: it is the shard's
    number, in its keys' hash tag, its entries and the database's ``redis_id`` columns)."""

    redis_id: int
    client: Any
    scripts: StockScripts
    leases: Leases

    @classmethod
    def on(cls, redis_id: int, client: Any, leases: Leases | None = None,
           clock: Callable[[], int] | None = None) -> StockNode:
        """Shard `redis_id` behind `client`. `clock` stands in for the shard's Redis clock
        (TIME) in tests; production passes none."""
        return cls(redis_id, client, StockScripts(client, clock), leases or Leases(client))

    def now_ms(self) -> int:
        """The shard's clock (its master's Redis TIME): the one clock of its due times."""
        return self.scripts.now_ms()

    def close(self) -> None:
        self.leases.close()


def master_of(shard: int, masters: int) -> int:
    """The index of the master that serves `shard` when shards are spread over `masters`."""
    return shard % masters


def connect_shards(clients: Sequence[Any], shards: int,
                   clock: Callable[[], int] | None = None) -> list[StockNode]:
    """One StockNode per shard, shard 0 first: shard N on ``clients[N % len(clients)]``.

    Shards of one client share its StockScripts and Leases (one keeper per master). `clock`
    stands in for the masters' Redis TIME in tests.
    """
    if not clients or shards < 1:
        raise ValueError("stock shards need at least one client and one shard")
    per_client = [(client, StockScripts(client, clock), Leases(client)) for client in clients]
    nodes = []
    for shard in range(shards):
        client, scripts, leases = per_client[master_of(shard, len(clients))]
        nodes.append(StockNode(shard, client, scripts, leases))
    return nodes


def master_clients(settings: Settings, socket_timeout: float = 5.0) -> list[Any]:
    """One client per stock master of `settings` (a cluster: its one client; a sentinel://
    URL: a client that follows its master's failovers)."""
    from tasks.config.redisconn import redis_client

    timeouts: dict[str, Any] = {"socket_timeout": socket_timeout,
                                "socket_connect_timeout": socket_timeout}
    if settings.redis_cluster_nodes and not restock_settings(settings).redis_urls:
        return [redis_client(settings.redis_url, cluster_nodes=settings.redis_cluster_nodes,
                             **timeouts)]
    return [redis_client(url, sentinel_master=settings.sentinel_master, **timeouts)
            for url in restock_settings(settings).nodes(settings)]


def close_shards(nodes: Sequence[StockNode]) -> None:
    """Close every distinct lease manager and client of `nodes` once."""
    seen: set[int] = set()
    for node in nodes:
        if id(node.leases) not in seen:
            seen.add(id(node.leases))
            node.close()
        if id(node.client) not in seen:
            seen.add(id(node.client))
            node.client.close()


def stock_nodes(res: Resources) -> list[StockNode]:
    """This process's stock shards for `res.settings`, shard 0 first."""
    return res.shared("stock_nodes", lambda settings: connect_shards(
        master_clients(settings), restock_settings(settings).shards))
