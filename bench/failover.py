"""`python -m bench failover [--db URL] [--broker URL] [--ttl S] [--interval S]`.

How long a range partition stays unworked when its worker goes away, on real processes: a
control worker (`-Q control,restock`, which runs the reconcile rounds), a beat, and range
workers (`-Q ranges,celery`, one slot each), as the Procfile runs them. Four phases, each a
fresh `cm_data` run whose batches sleep `--batch-s` so partitions last long enough to act on:

- crash: kill -9 (the whole worker) the owner of a running partition while another range
  worker is free; the time until a newer owner commits a batch of that partition;
- pool crash: kill -9 only the pool process running such a partition (the OOM killer's way),
  its worker's main process alive, which hands the partition back at once
  (tasks.ranges.poolexit); the same time;
- graceful handover: SIGTERM (warm shutdown) such an owner; the same time;
- saturated crash: the crash again, while every other range slot is busy and fresh
  partitions wait in the `ranges` queue.

"A newer owner commits" is read from the data itself: the first row of the partition written
under a fence above the old owner's. Every phase then runs its job to the end and counts the
rows processed other than exactly once (`rows_lost`: never, `rows_duplicated`: more than once).

LEASE_TTL and RECONCILE_INTERVAL default to the platform's defaults (tasks.config.settings). The
database defaults to its own PostgreSQL database `bench_failover` (created if missing; its
platform tables are dropped and recreated each phase); the broker and the lease Redis to a
scratch Redis (bench/scratch.py). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, make_url, select, text

from bench.range import BENCH_JOB_MODULES
from bench.scratch import NotScratch, flush, open_scratch
from devtools.demo import Fleet, reset_database
from examples.seed import seed_cm_data
from examples.tables import CM_DATA, migrate
from tasks.config.settings import Settings, redact
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tasks.store.migrate import upgrade
from tasks.store.resources import make_engine

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
BENCH_REDIS_DB = 15
DEFAULT_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_failover"
BATCH = 50  # rows per batch


@dataclass(frozen=True)
class Knobs:
    ttl: float
    interval: float
    batch_s: float
    range_workers: int = 3

    def rows_for(self, seconds: float) -> int:
        """Rows one partition works through in about `seconds` (batches sleep `batch_s`)."""
        return BATCH * max(math.ceil(seconds / self.batch_s), 4)

    @property
    def failover_bound(self) -> float:
        return self.ttl + self.interval


def _parse(argv: list[str]) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(prog="python -m bench failover", description=__doc__)
    parser.add_argument("--db", default=DEFAULT_DB, help=f"SQLAlchemy URL (default {DEFAULT_DB}"
                        "; sqlite:///PATH works too)")
    parser.add_argument("--broker", default=None,
                        help="Celery broker URL (default: the scratch Redis), e.g. "
                             "amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--ttl", type=float, default=defaults.lease_ttl, help="LEASE_TTL")
    parser.add_argument("--interval", type=float, default=defaults.reconcile_interval,
                        help="RECONCILE_INTERVAL")
    parser.add_argument("--batch-s", type=float, default=0.1,
                        help="seconds each batch sleeps (CM_DATA_BATCH_DELAY)")
    args = parser.parse_args(argv)
    if not (args.ttl > 0 and args.interval > 0 and args.batch_s > 0):
        parser.error("--ttl, --interval and --batch-s must be greater than 0")
    return args


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database `url` names when it is missing (the bench's own)."""
    parts = make_url(url)
    if parts.get_backend_name() != "postgresql" or not parts.database:
        return
    admin = make_engine(parts.set(database="postgres").render_as_string(hide_password=False))
    try:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            found = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"),
                                 {"d": parts.database}).first()
            if not found:
                conn.exec_driver_sql(f'CREATE DATABASE "{parts.database}"')
    finally:
        admin.dispose()


class Phase:
    """One phase's processes: a control worker, a beat and `range_workers` range workers."""

    def __init__(self, env: dict[str, str], logs: Path, name: str, range_workers: int) -> None:
        self.name = name
        self.fleet = Fleet(env, logs)
        self.workers = [f"{name}-w{i}" for i in range(range_workers)]

    def start(self) -> None:
        common = ("-P", "prefork", "--loglevel=INFO", "--without-mingle", "--without-gossip")
        self.fleet.start(f"{self.name}-control", "worker", "-c", "2", "-n",
                         f"{self.name}-control@%h", "-Q", "control,restock", *common)
        for worker in self.workers:
            self.fleet.start(worker, "worker", "-c", "1", "-n", f"{worker}@%h",
                             "-Q", "ranges,celery", *common)
        for name in (f"{self.name}-control", *self.workers):
            self.fleet.wait_ready(name, "ready.", timeout=120)
        self.fleet.start(f"{self.name}-beat", "beat", "--loglevel=INFO")

    def owner_worker(self, owner: str | None) -> str | None:
        """The worker (of this phase) a work row's owner (`name@host:pid`) names."""
        for worker in self.workers:
            if owner and owner.startswith(f"{worker}@"):
                return worker
        return None

    def stop(self) -> None:
        self.fleet.stop_all()


def _work(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(WORK).where(WORK.c.job == "cm_data")).all())


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return value


def _committed_by_newer(engine: Engine, lo: int, hi: int, fence: int) -> bool:
    """True once a row of lo..hi was written under a fence above `fence`: a newer owner's
    batch committed."""
    with engine.connect() as conn:
        found = conn.execute(select(CM_DATA.c.id).where(
            CM_DATA.c.id.between(lo, hi), CM_DATA.c.processed_fence > fence).limit(1)).first()
    return found is not None


def _finished(engine: Engine) -> bool:
    work = _work(engine)
    return bool(work) and all(w.status in S.FINISHED for w in work)


def _victim(engine: Engine, phase: Phase, busy: int) -> Any:
    """A partition mid-run (two batches in) on a range worker, once `busy` range workers run
    partitions."""
    def pick() -> Any:
        running = [w for w in _work(engine)
                   if w.status == S.RUNNING and phase.owner_worker(w.owner) is not None]
        if len({w.owner for w in running}) < busy:
            return None
        return next((w for w in running if w.next_id >= w.lo + 2 * BATCH), None)

    return _wait(pick, 180, f"{busy} range worker(s) running partitions")


@dataclass
class Outcome:
    seconds: float
    lost: int
    duplicated: int


def _count(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        lost = conn.execute(select(func.count()).where(CM_DATA.c.processed_count == 0)).scalar()
        dup = conn.execute(select(func.count()).where(CM_DATA.c.processed_count > 1)).scalar()
    return int(lost or 0), int(dup or 0)


def _prepare(engine: Engine, rows: int) -> None:
    reset_database(engine)
    upgrade(engine)
    migrate(engine)
    seed_cm_data(engine, rows)


def run_phase(engine: Engine, env: dict[str, str], logs: Path, name: str, *,
              workers: int, parts: int, part_seconds: float, busy: int,
              act: Callable[[Fleet, str, Any], None], knobs: Knobs) -> Outcome:
    """One fresh run of `parts` partitions on `workers` range workers: act on the owner of a
    running partition once `busy` range workers run partitions; time the takeover."""
    per_part = knobs.rows_for(part_seconds)
    _prepare(engine, parts * per_part)
    flush(env["REDIS_URL"])
    env = dict(env, CM_DATA_PARTITION_SIZE=str(per_part))
    client = _client(env)
    client.control.purge()  # a broker other than the scratch Redis may hold an older run's
    phase = Phase(env, logs, name, workers)
    try:
        phase.start()
        client.send_task("tasks.ranges.start", ["cm_data"])
        row = _victim(engine, phase, busy)
        victim = phase.owner_worker(row.owner)
        assert victim is not None
        started = time.monotonic()
        act(phase.fleet, victim, row)
        print(f"  {name}: {victim} (partition {row.part}, fence {row.fence}) acted on; "
              "waiting for a newer owner's commit", flush=True)
        limit = 10 * knobs.failover_bound + 30 * part_seconds + 120
        _wait(lambda: _committed_by_newer(engine, row.lo, row.hi, row.fence), limit,
              f"a takeover of partition {row.part}")
        seconds = time.monotonic() - started
        how = _how_taken(logs, phase, row.part)
        print(f"  {name}: taken over after {seconds:.2f} s ({how}); finishing the run",
              flush=True)
        _wait(lambda: _finished(engine), limit, "the run to finish")
    finally:
        client.close()
        phase.stop()
    lost, duplicated = _count(engine)
    print(f"  {name}: done; rows lost {lost}, duplicated {duplicated}", flush=True)
    return Outcome(seconds, lost, duplicated)


def _how_taken(logs: Path, phase: Phase, part: int) -> str:
    """How `part` was taken over, as this phase's worker logs tell: adopted by a holder at a
    batch boundary, taken as an orphan by a holder between two partitions (both ahead of any
    queued partition), or from its queued message."""
    text = "".join((logs / f"{worker}.log").read_text(errors="replace")
                   for worker in phase.workers if (logs / f"{worker}.log").exists())
    if f"adopting part {part}," in text:
        return "adopted by a running holder"
    if f"taking orphan part {part}," in text:
        return "taken as an orphan by a holder between partitions"
    return "from its queued message"


def _client(env: dict[str, str]) -> Any:
    """A client routing as the platform does (its queues: tasks.worker.queues)."""
    from celery import Celery

    from tasks.celery import amqp_options, is_amqp
    from tasks.wings import WINGS, load_settings
    from tasks.worker.queues import routing_config

    settings = load_settings(env)
    client = Celery(broker=settings.broker_url, backend=settings.result_backend,
                    set_as_current=False)
    client.conf.update(routing_config(settings, WINGS))
    if is_amqp(settings.broker_url):
        client.conf.update(amqp_options(settings, client.conf.task_queues))
    return client


def _crash(fleet: Fleet, worker: str, _row: Any) -> None:
    fleet.kill(worker)  # SIGKILL to the worker's whole process group: main and pool


def _pool_crash(fleet: Fleet, worker: str, row: Any) -> None:
    """SIGKILL to the pool process holding `row` (its owner, `name@host:pid`), not its worker."""
    pid = int(row.owner.rsplit(":", 1)[1])
    assert pid != fleet.procs[worker].pid, "the owner is a pool process, not the worker"
    os.kill(pid, signal.SIGKILL)


def _term(fleet: Fleet, worker: str, _row: Any) -> None:
    os.kill(fleet.procs[worker].pid, signal.SIGTERM)  # warm shutdown


def measure(engine: Engine, env: dict[str, str], logs: Path, knobs: Knobs) -> dict[str, Any]:
    # Saturated: the two surviving range workers' queue (their running partitions and the
    # four queued) lasts about 3 * short, past the takeover's dispatch (TTL + interval).
    short = max(knobs.failover_bound / 2, 1.0)
    # One partition of about 8 s (less with a short TTL): acted on mid-run, whatever is left
    # runs after the takeover.
    single = min(8.0, max(2 * knobs.failover_bound, 2.0))
    print(f"crash failover (a range worker free), TTL {knobs.ttl:g} s, interval "
          f"{knobs.interval:g} s:", flush=True)
    crash = run_phase(engine, env, logs, "crash", workers=2, parts=1, part_seconds=single,
                      busy=1, act=_crash, knobs=knobs)
    print("pool process crash (kill -9 of the pool process, its worker alive):", flush=True)
    pool = run_phase(engine, env, logs, "pool", workers=2, parts=1, part_seconds=single,
                     busy=1, act=_pool_crash, knobs=knobs)
    print("graceful handover (SIGTERM, a range worker free):", flush=True)
    term = run_phase(engine, env, logs, "term", workers=2, parts=1, part_seconds=single,
                     busy=1, act=_term, knobs=knobs)
    print(f"saturated crash failover ({knobs.range_workers} range workers all busy, "
          "4 partitions queued):", flush=True)
    saturated = run_phase(engine, env, logs, "saturated", workers=knobs.range_workers,
                          parts=knobs.range_workers + 4, part_seconds=short,
                          busy=knobs.range_workers, act=_crash, knobs=knobs)
    phases = (crash, pool, term, saturated)
    return {
        "lease_ttl_s": knobs.ttl, "reconcile_interval_s": knobs.interval,
        "crash_failover_s": round(crash.seconds, 2),
        "pool_crash_failover_s": round(pool.seconds, 2),
        "graceful_handover_s": round(term.seconds, 2),
        "saturated_crash_failover_s": round(saturated.seconds, 2),
        "rows_lost": sum(p.lost for p in phases),
        "rows_duplicated": sum(p.duplicated for p in phases),
    }


def main(argv: list[str]) -> int:
    args = _parse(argv)
    knobs = Knobs(ttl=args.ttl, interval=args.interval, batch_s=args.batch_s)
    try:
        scratch = open_scratch(BENCH_REDIS_DB)
    except NotScratch as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    broker = args.broker or scratch.url
    env = dict(os.environ, REDIS_URL=scratch.url, BROKER_URL=broker, RESULT_BACKEND=scratch.url,
               DATABASE_URL=args.db, PYTHONPATH=str(ROOT), EXTRA_TASK_MODULES=BENCH_JOB_MODULES,
               LEASE_TTL=str(args.ttl),
               RECONCILE_INTERVAL=str(args.interval), CM_DATA_BATCH_SIZE=str(BATCH),
               CM_DATA_BATCH_DELAY=str(args.batch_s), CM_DATA_PARALLELISM="1",
               CM_DATA_TARGET_BATCH_S="0", RANGE_SLICE="300")
    print(f"bench failover: database {redact(args.db)}, broker {redact(broker)}, "
          f"logs in {logs}", flush=True)
    try:
        ensure_database(args.db)
        engine = make_engine(args.db)
        try:
            result = measure(engine, env, logs, knobs)
        finally:
            engine.dispose()
    finally:
        scratch.stop()
    result["broker"] = broker.split("://", 1)[0]
    print(json.dumps(result))
    return 0 if result["rows_lost"] == result["rows_duplicated"] == 0 else 1
