"""Seed the demo table `cm_data` with rows to process."""

from __future__ import annotations

from sqlalchemy import Engine, func, insert, select

from tasks.store.models import CM_DATA

__all__ = ["seed_cm_data"]

CHUNK = 20_000


def seed_cm_data(engine: Engine, rows: int, start_id: int | None = None) -> tuple[int, int]:
    """Append `rows` rows with `status = 0`; return the (first, last) id written."""
    if rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    table = CM_DATA
    with engine.connect() as conn:
        current = conn.execute(select(func.max(table.c.id))).scalar() or 0
    first = start_id if start_id is not None else current + 1
    with engine.begin() as conn:  # writes first: SQLite waits for its lock instead of failing
        for lo in range(first, first + rows, CHUNK):
            hi = min(lo + CHUNK, first + rows)
            conn.execute(insert(table), [
                {"id": i, "status": 0, "payload": f"row-{i}", "processed_count": 0,
                 "processed_fence": 0} for i in range(lo, hi)])
    return first, first + rows - 1
