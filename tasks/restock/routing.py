"""Where an order's stock lives: a SKU's Redis node and a member's delay queue (seed 002).

A SKU lives on one Redis node (crc32 of its id, modulo the nodes), so "never below zero" is one
script on one node and a rebuild recomputes a SKU in one place. Within the node, the member id
picks the delay queue (as the seed routes by member), spreading drain work. The queue names
are the settings' (``Settings.restock_queue_names``: q0, q1, ...), passed in, never spelled
here.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = ["Router"]


@dataclass(frozen=True)
class Router:
    """Which Redis node holds a SKU, and which of the node's `queues` a member's items use."""

    nodes: int
    queues: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.nodes < 1 or not self.queues:
            raise ValueError("a router needs at least one node and one queue")

    def node_for(self, sku_id: str) -> int:
        return zlib.crc32(sku_id.encode()) % self.nodes

    def queue_for(self, member_id: str) -> str:
        return self.queues[zlib.crc32(member_id.encode()) % len(self.queues)]
