"""`python -m bench scale [--db URL ...] [--parts N,N] [--slots N]`.

What a range job costs as its plan grows, on real processes: for each database and each
partition count, a fresh `cm_data` table of `--rows-per-part` rows per partition, one range
worker (`-Q ranges,celery`, `--slots` pool processes) and RANGE_RUNNERS equal to its slots.
This process plays beat: it runs `tasks.ranges.start` (timed: `start_s`) and then a reconcile
round every RECONCILE_INTERVAL (each timed: `round_p50_s`, `round_p99_s`) until the run
succeeded, while a thread samples the broker's `ranges` list every 0.1 s (`max_queue`).
`rows_per_s` is the table's rows over the time from start to success (past `--max-s`, the
rows done by then over that time, with `finished` false).

Each configuration runs in a child process of its own (the platform's settings are read once
per process). Databases: a SQLite file in a temporary directory and, by default, the
PostgreSQL database `bench_scale` (created if missing; its tables dropped and recreated). The
broker and lease Redis is a scratch Redis (bench/scratch.py). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from bench.failover import ROOT, ensure_database
from bench.range import BENCH_JOB_MODULES
from bench.scratch import NotScratch, flush, open_scratch
from tasks.config.settings import redact

__all__ = ["main"]

BENCH_REDIS_DB = 14
DEFAULT_DBS = ("sqlite", "postgresql+psycopg://postgres@127.0.0.1:5432/bench_scale")
INTERVAL = 1.0  # RECONCILE_INTERVAL of the runs, seconds


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__)
    parser.add_argument("--db", action="append", default=None,
                        help="SQLAlchemy URL, or 'sqlite' for a temporary file (repeatable; "
                             f"default {', '.join(DEFAULT_DBS)})")
    parser.add_argument("--parts", default="1000,10000", help="partition counts")
    parser.add_argument("--rows-per-part", type=int, default=10)
    parser.add_argument("--rows", type=int, default=None,
                        help="the table's rows for every partition count (then the "
                             "partitions are rows / parts long; default: parts x "
                             "rows-per-part)")
    parser.add_argument("--slots", type=int, default=2, help="the range worker's processes")
    parser.add_argument("--jobs", type=int, default=1,
                        help="jobs of --parts partitions each over one table (job K owns the "
                             "ids K modulo N); each keeps at most --runners runner messages")
    parser.add_argument("--runners", type=int, default=None,
                        help="RANGE_RUNNERS (default: --slots for one job, 1 for several)")
    parser.add_argument("--max-s", type=float, default=1800.0,
                        help="stop each configuration's run after this many seconds and report "
                             "what was measured so far (finished false, rows_per_s of the rows "
                             "done by then)")
    parser.add_argument("--child", nargs=2, metavar=("DB", "PARTS"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


class QueueDepth:
    """The longest the broker's `ranges` list was, sampled every 0.1 s on a thread."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.most = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self.most = max(self.most, int(self.client.llen("ranges")))

    def close(self) -> int:
        self.stop.set()
        self.thread.join(5)
        self.client.close()
        return self.most


def child(db: str, parts: int, rows_per_part: int) -> dict[str, Any]:
    """One configuration, in this process (its environment set by `main`): `parts` partitions
    of one job `cm_data`, or with BENCH_SCALE_JOBS=N, N jobs of `parts` partitions each."""
    from devtools.demo import Fleet, reset_database
    from examples.seed import seed_cm_data
    from examples.tables import migrate
    from tasks.store.migrate import upgrade
    from tasks.store.resources import make_engine

    jobs = int(os.environ.get("BENCH_SCALE_JOBS") or "0")
    engine = make_engine(db)
    reset_database(engine)
    upgrade(engine)
    migrate(engine)
    seed_cm_data(engine, max(jobs, 1) * parts * rows_per_part)
    engine.dispose()
    flush(os.environ["REDIS_URL"])
    logs = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    fleet = Fleet(os.environ, logs)
    fleet.start("range", "worker", "-P", "prefork", "-c", os.environ["BENCH_SCALE_SLOTS"],
                "-n", "range@%h", "-Q", "ranges,celery", "--loglevel=INFO",
                "--without-mingle", "--without-gossip")
    fleet.wait_ready("range", "ready.", timeout=120)
    depth = QueueDepth(os.environ["REDIS_URL"])
    try:
        found = _measure(jobs)
    finally:
        max_queue = depth.close()
        fleet.stop_all()
    rows = max(jobs, 1) * parts * rows_per_part if found["finished"] else _rows_done(db)
    seconds = found.pop("seconds")
    return {"parts": max(jobs, 1) * parts, "jobs": max(jobs, 1), **found,
            "max_queue": max_queue, "rows_per_s": round(rows / seconds, 1), "rows_done": rows}


def _rows_done(db: str) -> int:
    """Rows the runs processed so far (every job's partitions' committed `rows_done`)."""
    from sqlalchemy import func, select

    from tasks.ranges.tables import WORK
    from tasks.store.resources import make_engine

    engine = make_engine(db)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.sum(WORK.c.rows_done), 0)))
                       .scalar_one())
    finally:
        engine.dispose()


def _measure(jobs: int) -> dict[str, Any]:
    """Start the jobs (timed), then play beat's reconcile rounds (each timed) until every run
    succeeded, with the snapshot on a thread after the second round."""
    from bench.scale_jobs import job_names
    from tasks.ranges.tasks import start_job

    names = job_names(jobs) if jobs else ["cm_data"]
    began = time.monotonic()
    for name in names:
        start_job(name, "bench")
    start_s = time.monotonic() - began
    seen: dict[str, Any] = {}
    aside = threading.Thread(target=lambda: seen.update(snapshot(names[0])), daemon=True)
    rounds, finished = _rounds_until_done(names, aside.start,
                                          float(os.environ.get("BENCH_SCALE_MAX_S") or 1800))
    seconds = time.monotonic() - began
    if aside.ident is None:  # the run ended before a second round: after it, then
        aside.start()
    aside.join(300)
    return {"start_s": round(start_s, 3), "round_p50_s": round(statistics.median(rounds), 4),
            "round_p99_s": round(_p99(rounds), 4), "rounds": len(rounds), "seconds": seconds,
            "finished": finished, **seen}


def snapshot(job: str) -> dict[str, Any]:
    """Mid-run (after the second round): `python -m tasks status --json` as an operator runs
    it (a new process: interpreter, imports and the queries), the console job page's API call
    for `job` (`tasks.console.actions.job_detail`, in this process, without HTTP), and the
    Redis the run uses (keys and memory)."""
    from tasks.console.actions import job_detail, partition_query

    began = time.monotonic()
    status = subprocess.run([sys.executable, "-m", "tasks", "status", "--json"], cwd=ROOT,
                            capture_output=True, timeout=120, check=True)
    status_s = time.monotonic() - began
    job_detail(job, partition_query([], None, "", None, None))  # connections warm
    began = time.monotonic()
    page = job_detail(job, partition_query([], None, "", None, None))
    console_s = time.monotonic() - began
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        keys, memory = client.dbsize(), client.info("memory")["used_memory"]
    finally:
        client.close()
    return {"status_json_s": round(status_s, 3), "status_json_bytes": len(status.stdout),
            "console_api_s": round(console_s, 4), "console_api_parts": len(page["partitions"]),
            "redis_keys": keys, "redis_used_memory": memory}


def _rounds_until_done(names: list[str], midway: Any,
                       max_s: float) -> tuple[list[float], bool]:
    """Beat's reconcile round (`tasks.ranges.reconcile`'s body: every active job), each made
    due first and timed, until every job's run succeeded (True) or `max_s` passed (False)."""
    from tasks.celery import settings
    from tasks.ranges.reconciler import due_now
    from tasks.ranges.runs import current_run
    from tasks.ranges.tables import RunState
    from tasks.ranges.tasks import reconcile
    from tasks.store.resources import resources_for

    sessions = resources_for(settings).sessions
    rounds: list[float] = []
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        runs = [current_run(sessions, name) for name in names]
        if all(run is not None and run.state == RunState.SUCCEEDED for run in runs):
            return rounds, True
        for name in names:
            due_now(sessions, name)
        began = time.monotonic()
        reconcile()
        rounds.append(time.monotonic() - began)
        if len(rounds) == 2:
            midway()
        time.sleep(INTERVAL)
    return rounds, False


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _one(args: argparse.Namespace, env: dict[str, str], db: str, parts: int,
         per_part: int) -> dict[str, Any]:
    url = db
    if db == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp(prefix='bench-scale-')}/scale.sqlite"
    ensure_database(url)
    done = subprocess.run(
        [sys.executable, "-m", "bench", "scale", "--child", url, str(parts),
         "--rows-per-part", str(per_part)],
        env=dict(env, DATABASE_URL=url), cwd=ROOT, capture_output=True, text=True,
        timeout=args.max_s + 900)
    if done.returncode != 0:
        raise RuntimeError(f"bench scale child failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["db"] = url.split(":", 1)[0].split("+", 1)[0]
    print(f"  {result['db']} {parts} partitions: {json.dumps(result)}", flush=True)
    return result


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.rows_per_part)))
        return 0
    try:
        scratch = open_scratch(BENCH_REDIS_DB)
    except NotScratch as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ, REDIS_URL=scratch.url, BROKER_URL=scratch.url,
               RESULT_BACKEND=scratch.url, PYTHONPATH=str(ROOT),
               EXTRA_TASK_MODULES=f"{BENCH_JOB_MODULES},bench.scale_jobs",
               RECONCILE_INTERVAL=str(INTERVAL),
               RANGE_RUNNERS=str(args.runners or (args.slots if args.jobs <= 1 else 1)),
               BENCH_SCALE_SLOTS=str(args.slots), BENCH_SCALE_MAX_S=str(args.max_s),
               BENCH_SCALE_JOBS=str(args.jobs if args.jobs > 1 else 0),
               CM_DATA_PARTITION_SIZE=str(args.rows_per_part),
               CM_DATA_BATCH_SIZE="500", CM_DATA_BATCH_DELAY="0", CM_DATA_PARALLELISM="1",
               CM_DATA_TARGET_BATCH_S="0")
    dbs = args.db or list(DEFAULT_DBS)
    print(f"bench scale: databases {', '.join(redact(d) for d in dbs)}, {args.slots} slots",
          flush=True)
    results = []
    try:
        for db in dbs:
            for parts in (int(p) for p in args.parts.split(",")):
                per_part = args.rows_per_part if args.rows is None else -(-args.rows // parts)
                # A job's partition covers per_part of its rows: jobs x per_part ids.
                size = per_part * max(args.jobs, 1)
                results.append(_one(args, dict(env, CM_DATA_PARTITION_SIZE=str(size)),
                                    db, parts, per_part))
    finally:
        scratch.stop()
    print(json.dumps({"slots": args.slots, "jobs": args.jobs, "runs": results}))
    return 0
