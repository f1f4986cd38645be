"""Where an order's stock lives: a SKU's shard and a member's delay queue.

A SKU lives in one logical shard, ``crc32(sku_id) % shards``: fixed for a given shard count
(RESTOCK_SHARDS), whatever the Redis layout, so "never below zero" is one script in one slot
and a rebuild recomputes a SKU in one place. Where a shard's slot lives (one Redis, a Cluster
master, master N % masters) is `tasks.restock.shards`'s business, never the SKU's. Within the
shard, the member id picks the delay queue (as the seed routes by member), spreading drain
work. The queue names are the settings' (the restock section's ``queue_names``: q0, q1, ...),
passed in, never spelled here.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = ["Router", "shard_of"]


def shard_of(sku_id: str, shards: int) -> int:
    """The shard of `sku_id` among `shards`: crc32 of its UTF-8 bytes, modulo the count."""
    return zlib.crc32(sku_id.encode()) % shards


@dataclass(frozen=True)
class Router:
    """Which of the `shards` holds a SKU, and which of the shard's `queues` a member uses."""

    shards: int
    queues: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.shards < 1 or not self.queues:
            raise ValueError("a router needs at least one shard and one queue")

    def shard_for(self, sku_id: str) -> int:
        return shard_of(sku_id, self.shards)

    def queue_for(self, member_id: str) -> str:
        return self.queues[zlib.crc32(member_id.encode()) % len(self.queues)]
