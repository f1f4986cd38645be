"""`python -m examples.seed --rows N`: append N rows with `status = 0` to `cm_data`, with ids
after the current maximum, on the platform's DATABASE_URL (creating the table first if it is
missing)."""

from __future__ import annotations

import argparse

from sqlalchemy import Engine, func, insert, select

from examples.tables import CM_DATA, migrate
from tasks.config.settings import load_settings
from tasks.store.resources import make_engine

__all__ = ["seed_cm_data", "main"]

CHUNK = 20_000  # rows per INSERT: under every driver's bind limit


def seed_cm_data(engine: Engine, rows: int, start_id: int | None = None) -> tuple[int, int]:
    """Append `rows` rows with `status = 0`; return the (first, last) id written."""
    if rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    with engine.connect() as conn:
        current = conn.execute(select(func.max(CM_DATA.c.id))).scalar() or 0
    first = start_id if start_id is not None else current + 1
    with engine.begin() as conn:  # writes first: SQLite waits for its lock instead of failing
        for lo in range(first, first + rows, CHUNK):
            hi = min(lo + CHUNK, first + rows)
            conn.execute(insert(CM_DATA), [
                {"id": i, "status": 0, "payload": f"row-{i}", "processed_count": 0,
                 "processed_fence": 0} for i in range(lo, hi)])
    return first, first + rows - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.seed", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to append")
    args = parser.parse_args(argv)
    if args.rows < 0:
        parser.error(f"--rows must be at least 0, not {args.rows}")
    engine = make_engine(load_settings().database_url)
    try:
        migrate(engine)
        first, last = seed_cm_data(engine, args.rows)
    finally:
        engine.dispose()
    print(f"seeded ids {first}..{last}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
