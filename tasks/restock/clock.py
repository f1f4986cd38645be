"""The restock wing's one wall clock, for display only.

Every due time, maintenance window and expiry of the wing is read on the stock shard's own clock
(Redis ``TIME``: ``StockShard.now_ms``, ``StockScripts.now_ms``); this process's clock only
labels what an operator sees (``python -m tasks status``).
"""

from __future__ import annotations

import time

__all__ = ["wall_ms"]


def wall_ms() -> int:
    """This process's wall clock in milliseconds, for display only: every due time, window
    and expiry is read on the stock shard's clock (``StockShard.now_ms``)."""
    return time.time_ns() // 1_000_000
