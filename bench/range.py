"""`python -m bench range --db URL --rows N [--work trivial|cpu] [--key int|uuid|composite]`.

With `--key uuid` or `--key composite` it measures a keyed job against the integer-key job on
the same table instead (bench/range_keys.py); the rest of this docstring is `--key int`.

Measures, in one run on the same database: a raw single-process keyset scan-and-update script
on SQLAlchemy Core (no leases, no Celery, the same batch size and per-row work), the same scan
written on the bare database driver (sqlite3, psycopg or PyMySQL: what a user would write by
hand, bench/drivers.py: once writing by id range, once by id list), then the platform's
`cm_data` job on 1 and on 2 real prefork worker processes. Prints rows/s of each, the ratios
against the raw baseline (and the 1-worker rate against the two driver scripts:
`driver_ratio` and `driver_list_ratio`), and a final JSON line.

Each of the five is measured `--repeat` times (3 by default), in turns, from the same table
state, and its best rate is the one compared: on a shared machine one run of a second or less
varies by 10-20% either way, the same for every side, and the best of a few is the run least
disturbed by the rest of the machine (the way `timeit` reports the minimum of its repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import Engine, delete, func, select, update

from bench.cm_data import cpu_work
from bench.drivers import driver_list_scan, driver_scan
from bench.range_keys import keyed_main
from bench.scratch import NotScratch, flush, open_scratch
from devtools.demo import Fleet, reset_database, verify
from examples.seed import seed_cm_data
from examples.tables import CM_DATA, migrate
from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS, SCHEDULES, WORK, RunState
from tasks.store.migrate import upgrade
from tasks.store.resources import make_engine

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
BENCH_REDIS_DB = 13
# The benchmarks' workers register the benchmarks' variant of the example job the way a user
# registers a job: through EXTRA_TASK_MODULES.
BENCH_JOB_MODULES = "bench.cm_data"
# How often a platform run looks for its end: a run of 300,000 rows takes well under a second,
# so a coarse poll would add a sizeable share of it (half the interval on average).
POLL_S = 0.01


def raw_scan(engine: Engine, batch: int, work: str) -> float:
    """The baseline: keyset pagination and one UPDATE per batch, in one process."""
    table = CM_DATA
    started = time.perf_counter()
    done, next_id = 0, 0
    while True:
        with engine.begin() as conn:
            rows = conn.execute(select(table.c.id, table.c.payload)
                                .where(table.c.id >= next_id, table.c.status == 0)
                                .order_by(table.c.id).limit(batch)).all()
            if not rows:
                break
            if work == "cpu":
                for row in rows:
                    cpu_work(row)
            conn.execute(update(table).where(table.c.id.in_([r.id for r in rows]))
                         .values(status=1, processed_count=table.c.processed_count + 1))
        done += len(rows)
        next_id = rows[-1].id + 1
    return done / (time.perf_counter() - started)


def reset_rows(engine: Engine) -> None:
    """Every run starts from the same table state: all rows to do, vacuumed, and (SQLite) an
    empty write-ahead log."""
    with engine.begin() as conn:
        conn.execute(update(CM_DATA).values(status=0, processed_count=0, processed_fence=0))
        conn.execute(delete(WORK))
        conn.execute(delete(SCHEDULES))
        conn.execute(delete(RANGE_RUNS))
        conn.execute(delete(RANGE_RUN_EVENTS))
    if engine.dialect.name in ("postgresql", "sqlite"):
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM" if engine.dialect.name == "sqlite"
                                 else "VACUUM ANALYZE cm_data")
            if engine.dialect.name == "sqlite":
                # The reset and the VACUUM went through the write-ahead log (tens of MB at
                # 1,000,000 rows): copy it into the database now, or the first commit of the
                # run measured next would pay for that checkpoint.
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


def platform_run(engine: Engine, env: dict[str, str], workers: int,
                 logs: Path) -> tuple[float, float]:
    """Rows/s of the cm_data job on `workers` worker processes, from start to the end of its
    run (the closing round included), and the closing round's share of that time: from the
    last partition's end to the run's."""
    fleet = Fleet(env, logs)
    try:
        for i in range(workers):
            fleet.start(f"bench-w{workers}-{i}", "worker", "-P", "prefork", "-c", "1", "-n",
                        f"bench{workers}-{i}@%h", "--loglevel=INFO")
        for i in range(workers):
            fleet.wait_ready(f"bench-w{workers}-{i}", "ready.", timeout=90)
        client = Celery(broker=env["REDIS_URL"], set_as_current=False)
        with client.producer_or_acquire() as producer:  # the bench's own connection set-up
            producer.connection.ensure_connection(max_retries=3)
        started = time.perf_counter()
        client.send_task("tasks.ranges.start", ["cm_data"])
        while not _finished(engine):
            time.sleep(POLL_S)
        elapsed = time.perf_counter() - started
        client.close()
    finally:
        fleet.stop_all()
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(CM_DATA)).scalar() or 0
        last_part = conn.execute(select(func.max(WORK.c.finished_at))).scalar_one()
        run_end = conn.execute(select(RANGE_RUNS.c.finished_at)).scalar_one()
    return rows / elapsed, (run_end - last_part).total_seconds() / elapsed


def _finished(engine: Engine) -> bool:
    with engine.connect() as conn:
        state = conn.execute(select(RANGE_RUNS.c.state).order_by(RANGE_RUNS.c.id.desc())
                             .limit(1)).scalar()
    return state in RunState.ENDED


def _measure(engine: Engine, args: argparse.Namespace, db_url: str, redis_url: str,
             env: dict[str, str], workdir: Path) -> dict[str, list[Any]]:
    """Every measurement `args.repeat` times, in turns, each from the same table state."""
    runs: dict[str, list[Any]] = {"raw": [], "driver": [], "driver_list": [], "one": [],
                                  "two": [], "exactly_once": [], "closing_share": []}
    for _ in range(max(args.repeat, 1)):
        reset_rows(engine)
        runs["raw"].append(raw_scan(engine, args.batch, args.work))
        reset_rows(engine)
        runs["driver"].append(driver_scan(db_url, args.batch, args.work))
        reset_rows(engine)
        runs["driver_list"].append(driver_list_scan(db_url, args.batch, args.work))
        for workers, key in ((1, "one"), (2, "two")):
            reset_rows(engine)
            flush(redis_url)
            rate, closing_share = platform_run(engine, env, workers, workdir)
            runs[key].append(rate)
            runs["closing_share"].append(closing_share)
            runs["exactly_once"].append(verify(engine).exactly_once)
    return runs


def _each(rates: list[float]) -> str:
    return "best of " + ", ".join(f"{rate:,.0f}" for rate in rates)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench range", description=__doc__)
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: a SQLite file)")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--work", choices=("trivial", "cpu"), default="trivial")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--parallelism", type=int, default=2,
                        help="threads per worker for the per-row work (cpu)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each measurement; the best rate of each is compared")
    parser.add_argument("--key", choices=("int", "uuid", "composite"), default="int",
                        help="the key the job walks: int (cm_data, against raw scripts), or "
                             "uuid / composite against the integer key on the same table")
    parser.add_argument("--target-batch-s", type=float, default=0.25,
                        help="the platform's adaptive batch time, starting from --batch "
                             "(0: fixed batches of --batch rows, as the baselines use)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-range-"))
    db_url = args.db or f"sqlite:///{workdir}/bench.sqlite"
    try:
        scratch = open_scratch(BENCH_REDIS_DB)
    except NotScratch as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    redis_url = scratch.url
    engine = make_engine(db_url)
    if args.key != "int":
        try:
            return keyed_main(args, engine, db_url, redis_url, workdir, ROOT)
        finally:
            engine.dispose()
            scratch.stop()
    try:
        reset_database(engine)
        upgrade(engine)
        migrate(engine)
        seed_cm_data(engine, args.rows)
        env = dict(os.environ, REDIS_URL=redis_url, DATABASE_URL=db_url, PYTHONPATH=str(ROOT),
                   EXTRA_TASK_MODULES=BENCH_JOB_MODULES,
                   CM_DATA_PARTITION_SIZE=str(max(args.rows // 8, 1)),
                   CM_DATA_BATCH_SIZE=str(args.batch), CM_DATA_WORK=args.work,
                   CM_DATA_PARALLELISM=str(args.parallelism),
                   CM_DATA_TARGET_BATCH_S=str(args.target_batch_s), LEASE_TTL="10",
                   RECONCILE_INTERVAL="1")
        runs = _measure(engine, args, db_url, redis_url, env, workdir)
        raw, driver, driver_list = (max(runs["raw"]), max(runs["driver"]),
                                    max(runs["driver_list"]))
        rates = {1: max(runs["one"]), 2: max(runs["two"])}
        exactly_once = all(runs["exactly_once"])
        print(f"raw keyset scan-and-update: {raw:,.0f} rows/s ({_each(runs['raw'])})")
        print(f"driver script (keyset read, UPDATE by id range): {driver:,.0f} rows/s "
              f"({_each(runs['driver'])})")
        print(f"driver script (keyset read, UPDATE by id list): {driver_list:,.0f} rows/s "
              f"({_each(runs['driver_list'])})")
        print(f"closing round: {statistics.median(runs['closing_share']):.1%} of a run "
              "(median; from the last partition's end to the run's)")
        for workers, key in ((1, "one"), (2, "two")):
            print(f"platform, {workers} worker(s): {rates[workers]:,.0f} rows/s "
                  f"({_each(runs[key])}; ratio {rates[workers] / raw:.2f}; "
                  f"exactly once: {exactly_once})")
        result: dict[str, Any] = {
            "db": engine.dialect.name, "rows": args.rows, "work": args.work,
            "raw_rows_per_s": round(raw, 1),
            "one_worker_ratio": round(rates[1] / raw, 3),
            "two_worker_ratio": round(rates[2] / raw, 3),
            "exactly_once": exactly_once,
            "driver_raw_rows_per_s": round(driver, 1),
            "driver_ratio": round(rates[1] / driver, 3),
            "driver_list_raw_rows_per_s": round(driver_list, 1),
            "driver_list_ratio": round(rates[1] / driver_list, 3),
            "repeat": max(args.repeat, 1),
            "closing_round_share": round(statistics.median(runs["closing_share"]), 4),
        }
        print(json.dumps(result))
        return 0 if exactly_once else 1
    finally:
        engine.dispose()
        scratch.stop()
