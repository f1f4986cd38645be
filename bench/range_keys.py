"""`python -m bench range --key uuid|composite --db URL --rows N`: a keyed range job against
the integer-key job on the same table, in the same invocation.

One table (`keyed_rows`, bench/keyed.py) of N rows holds an integer id, a random UUID and a
timestamp; `keyed_int` walks it by id (id-span partitions), `keyed_uuid` by the UUID and
`keyed_composite` by (created_at, id), both in partitions cut by row count, with the same
effect (an UPDATE by the batch's ids), batch size and partition count (8). Each is run on one
real prefork worker `--repeat` times, in turns, from the same table state; the best rate of
each is compared. Prints rows/s of both, the ratio of the keyed run to the integer one (the
target is 0.8 or more) and a final JSON line.

Beside them, `raw_scan` walks each key the way a hand-written script would (one process, no
lease, the same reads in key order and the same UPDATE by ids): rows in UUID or timestamp
order lie scattered over a table stored in id order, so each batch's UPDATE dirties many more
pages than an id-ordered one, whatever runs it. `raw_ratio` (the keyed platform run against
the keyed script) separates that cost of the access pattern from the platform's own.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import Engine, delete, func, select, update

from bench.keyed import JOBS, KEYED, create, seed
from bench.scratch import flush
from devtools.demo import Fleet, reset_database
from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS, SCHEDULES, WORK, RunState
from tasks.store.migrate import upgrade

__all__ = ["keyed_main"]

POLL_S = 0.01
PARTITIONS = 8


def _reset(engine: Engine) -> None:
    """Every run from the same state: all rows to do, no plan, no run; vacuumed."""
    with engine.begin() as conn:
        conn.execute(update(KEYED).values(status=0, processed_count=0, processed_fence=0))
        for table in (WORK, SCHEDULES, RANGE_RUNS, RANGE_RUN_EVENTS):
            conn.execute(delete(table))
    if engine.dialect.name in ("postgresql", "sqlite"):
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM" if engine.dialect.name == "sqlite"
                                 else "VACUUM ANALYZE keyed_rows")
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


def raw_scan(engine: Engine, key: str, batch: int) -> float:
    """Rows/s of a one-process keyset walk of `key` doing the same UPDATE per batch."""
    job = JOBS[key]
    keyset, cols = job.keyset, job.keyset.columns
    dialect = engine.dialect.name
    first = select(*cols, KEYED.c.id).where(KEYED.c.status == 0).order_by(*cols).limit(batch)
    after = first.where(keyset.above(dialect, keyset.params()))
    mark = update(KEYED).values(status=1, processed_count=KEYED.c.processed_count + 1)
    done, cursor = 0, None
    started = time.perf_counter()
    while True:
        with engine.begin() as conn:
            rows = conn.execute(first if cursor is None else after,
                                keyset.bind(cursor) if cursor is not None else {}).all()
            if not rows:
                break
            conn.execute(mark.where(KEYED.c.id.in_([r.id for r in rows])))
        done += len(rows)
        cursor = tuple(rows[-1])[:len(cols)]
    return done / (time.perf_counter() - started)


def _once(engine: Engine, rows: int) -> bool:
    with engine.connect() as conn:
        once = conn.execute(select(func.count()).select_from(KEYED).where(
            KEYED.c.processed_count == 1)).scalar_one()
    return int(once) == rows


def _run(engine: Engine, env: dict[str, str], job: str, logs: Path) -> float:
    """Seconds from `start` to the end of `job`'s run (its closing round included), on one
    worker."""
    fleet = Fleet(env, logs)
    try:
        fleet.start(f"keyed-{job}", "worker", "-P", "prefork", "-c", "1", "-n",
                    f"keyed-{job}@%h", "--loglevel=INFO")
        fleet.wait_ready(f"keyed-{job}", "ready.", timeout=90)
        client = Celery(broker=env["REDIS_URL"], set_as_current=False)
        with client.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=3)
        started = time.perf_counter()
        client.send_task("tasks.ranges.start", [job])
        while not _ended(engine, job):
            time.sleep(POLL_S)
        elapsed = time.perf_counter() - started
        client.close()
    finally:
        fleet.stop_all()
    return elapsed


def _ended(engine: Engine, job: str) -> bool:
    with engine.connect() as conn:
        state = conn.execute(select(RANGE_RUNS.c.state).where(RANGE_RUNS.c.job == job)
                             .order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar()
    return state in RunState.ENDED


def keyed_main(args: argparse.Namespace, engine: Engine, db_url: str, redis_url: str,
               workdir: Path, root: Path) -> int:
    """The keyed benchmark (`args.key`: uuid or composite) against the integer key."""
    reset_database(engine)
    upgrade(engine)
    create(engine)
    seed(engine, args.rows)
    env = dict(os.environ, REDIS_URL=redis_url, DATABASE_URL=db_url, PYTHONPATH=str(root),
               EXTRA_TASK_MODULES="bench.keyed",
               KEYED_PARTITION_SIZE=str(max(args.rows // PARTITIONS, 1)),
               KEYED_BATCH_SIZE=str(args.batch), LEASE_TTL="10", RECONCILE_INTERVAL="1")
    names = {"int": JOBS["int"].name, args.key: JOBS[args.key].name}
    rates: dict[str, list[float]] = {k: [] for k in names}
    raws: dict[str, list[float]] = {k: [] for k in names}
    once = True
    for _ in range(max(args.repeat, 1)):
        for kind, job in names.items():
            _reset(engine)
            raws[kind].append(raw_scan(engine, kind, args.batch))
            _reset(engine)
            flush(redis_url)
            rates[kind].append(args.rows / _run(engine, env, job, workdir))
            once = once and _once(engine, args.rows)
    best = {k: max(v) for k, v in rates.items()}
    raw = {k: max(v) for k, v in raws.items()}
    ratio = best[args.key] / best["int"]
    for kind, job in names.items():
        each = ", ".join(f"{r:,.0f}" for r in rates[kind])
        print(f"{job} (key {kind}), 1 worker: {best[kind]:,.0f} rows/s (best of {each}); "
              f"raw script on the same key: {raw[kind]:,.0f} rows/s")
    print(f"ratio {args.key} / int: {ratio:.2f} (target >= 0.8); exactly once: {once}")
    result: dict[str, Any] = {
        "db": engine.dialect.name, "rows": args.rows, "key": args.key,
        "int_rows_per_s": round(best["int"], 1), "key_rows_per_s": round(best[args.key], 1),
        "key_ratio": round(ratio, 3), "exactly_once": once, "repeat": max(args.repeat, 1),
        "raw_int_rows_per_s": round(raw["int"], 1),
        "raw_key_rows_per_s": round(raw[args.key], 1),
        "raw_ratio": round(best[args.key] / raw[args.key], 3),
        "partitions": PARTITIONS, "batch": args.batch,
    }
    print(json.dumps(result))
    return 0 if once else 1
