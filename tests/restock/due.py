"""A test-only view of a delay queue: the entries due now by the shard's clock (due.lua, next
to this module). The drainer takes its batches with take.lua; only the tests look without
taking."""

from __future__ import annotations

from pathlib import Path

from lease.scripts import run_script
from tasks.restock.keys import delay_key
from tasks.restock.scripts import StockScripts

DUE = (Path(__file__).parent / "due.lua").read_text(encoding="utf-8")


def due(scripts: StockScripts, shard: int, queue: str, limit: int = 100) -> list[bytes]:
    """The delay queue's members due now by the shard's clock (the test's fake clock if
    `scripts` has one), earliest first, as the raw bytes stored."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    now = "" if scripts.clock is None else str(int(scripts.clock()))
    members = run_script(scripts.client, scripts.client.register_script(DUE),
                         [delay_key(shard, queue)], [now, limit])
    return [m if isinstance(m, bytes) else str(m).encode() for m in members]
