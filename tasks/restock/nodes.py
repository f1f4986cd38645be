"""The Redis stock nodes of the restock feature: one client, script set and lease manager each.

Node N is the N-th URL of RESTOCK_REDIS_URLS (default: REDIS_URL alone). Its keys carry the
hash tag ``{node:N}``, so several nodes may also share one Redis server or one Cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from lease import Leases
from tasks.resources import Resources
from tasks.restock.scripts import StockScripts

__all__ = ["StockNode", "connect_nodes", "stock_nodes"]


@dataclass
class StockNode:
    """Everything that talks to Redis node `redis_id`."""

    redis_id: int
    client: Any
    scripts: StockScripts
    leases: Leases

    @classmethod
    def on(cls, redis_id: int, client: Any, leases: Leases | None = None,
           clock: Callable[[], int] | None = None) -> StockNode:
        """The node behind `client`. `clock` stands in for the node's own clock (Redis TIME)
        in tests; production passes none."""
        return cls(redis_id, client, StockScripts(client, clock), leases or Leases(client))

    def now_ms(self) -> int:
        """The node's clock (Redis TIME): the one clock of its due times and windows."""
        return self.scripts.now_ms()

    def close(self) -> None:
        self.leases.close()


def connect_nodes(urls: Sequence[str], socket_timeout: float = 5.0) -> list[StockNode]:
    """One StockNode per URL, node 0 first."""
    return [StockNode.on(i, redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                                   socket_connect_timeout=socket_timeout))
            for i, url in enumerate(urls)]


def stock_nodes(res: Resources) -> list[StockNode]:
    """This process's stock nodes for `res.settings` (RESTOCK_REDIS_URLS), node 0 first."""
    return res.shared("stock_nodes", lambda settings: connect_nodes(settings.restock_nodes))
