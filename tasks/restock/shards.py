"""Where the logical stock shards live: one StockShard per shard, on its master's client.

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

__all__ = ["StockShard", "close_shards", "connect_shards", "master_clients", "master_of",
           "stock_shards"]


@dataclass
class StockShard:
    """Everything that talks to shard `number` (its keys' hash tag ``{stock:N}``): the client
    of its master, that client's script set and lease manager. The database and the redo
    entries keep the older name ``redis_id`` for the same number (their columns and field)."""

    number: int
    client: Any
    scripts: StockScripts
    leases: Leases

    @classmethod
    def on(cls, number: int, client: Any, leases: Leases | None = None,
           clock: Callable[[], int] | None = None) -> StockShard:
        """Shard `number` behind `client`. `clock` stands in for the shard's Redis clock
        (TIME) in tests; production passes none."""
        return cls(number, client, StockScripts(client, clock), leases or Leases(client))

    def now_ms(self) -> int:
        """The shard's clock (its master's Redis TIME): the one clock of its due times."""
        return self.scripts.now_ms()

    def close(self) -> None:
        self.leases.close()


def master_of(shard: int, masters: int) -> int:
    """The index of the master that serves `shard` when shards are spread over `masters`."""
    return shard % masters


def connect_shards(clients: Sequence[Any], shards: int,
                   clock: Callable[[], int] | None = None) -> list[StockShard]:
    """One StockShard per shard, shard 0 first: shard N on ``clients[N % len(clients)]``.

    Shards of one client share its StockScripts and Leases (one keeper per master). `clock`
    stands in for the masters' Redis TIME in tests.
    """
    if not clients or shards < 1:
        raise ValueError("stock shards need at least one client and one shard")
    per_client = [(client, StockScripts(client, clock), Leases(client)) for client in clients]
    return [StockShard(n, *per_client[master_of(n, len(clients))]) for n in range(shards)]


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


def close_shards(shards: Sequence[StockShard]) -> None:
    """Close every distinct lease manager and client of `shards` once."""
    seen: set[int] = set()
    for shard in shards:
        if id(shard.leases) not in seen:
            seen.add(id(shard.leases))
            shard.close()
        if id(shard.client) not in seen:
            seen.add(id(shard.client))
            shard.client.close()


def stock_shards(res: Resources) -> list[StockShard]:
    """This process's stock shards for `res.settings`, shard 0 first."""
    return res.shared("stock_shards", lambda settings: connect_shards(
        master_clients(settings), restock_settings(settings).shards))
