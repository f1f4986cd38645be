"""Range partitions written straight into `work_items` (one executemany), for the tests of the
status view, `status --json` and the console's job API at 10,000 partitions (issue 20).

Partition `p` of a planted job covers ids `p*100+1 .. (p+1)*100`; its state follows `p % 10`:
0-5 done, 6 running, 7 pending, 8 failed, 9 paused. Running ones have an owner (three workers,
seven pool processes) and a rate that differs from its neighbours' (with a fraction, so a float
column is exercised).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, insert

from tasks.ranges.tables import WORK
from tasks.store.db import utcnow

__all__ = ["plant", "STATE_OF", "state_of", "owner_of", "rate_of", "SIZE"]

SIZE = 100
STATE_OF = ("done",) * 6 + ("running", "pending", "failed", "paused")
_DONE_BY = {"done": SIZE, "running": 50, "pending": 0, "failed": 10, "paused": 20}


def state_of(part: int) -> str:
    return STATE_OF[part % 10]


def owner_of(part: int) -> str | None:
    return f"w{part % 3}@host:{1000 + part % 7}" if state_of(part) == "running" else None


def rate_of(part: int) -> float:
    return 100.25 + (part * 7919) % 997 if state_of(part) == "running" else 0.0


def _row(job: str, part: int) -> dict[str, Any]:
    state, lo = state_of(part), part * SIZE + 1
    done = _DONE_BY[state]
    return {"kind": "range", "job": job, "part": part, "lo": lo, "hi": lo + SIZE - 1,
            "next_id": lo + done, "fence": 1, "status": state, "owner": owner_of(part),
            "claims": 1, "rows_done": done, "rate": rate_of(part),
            "error": "ValueError: a bad row" if state == "failed" else None,
            "heartbeat_at": utcnow()}


def plant(engine: Engine, job: str, count: int) -> None:
    """`count` partitions of `job`, as described above, in one transaction."""
    with engine.begin() as conn:
        conn.execute(insert(WORK), [_row(job, part) for part in range(count)])
