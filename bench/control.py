"""`python -m bench control [--db URL] [--rows N]`: how fast the range-job controls act.

On one database and two real prefork workers (plus beat), with the cm_data job:

- start_to_first_commit_s: `tasks.ranges.start` sent -> the first batch committed (idle
  workers, no batch delay);
- last_commit_to_done_s: the last row committed -> every partition finished;
- pause_s: `pause` returned -> no partition running and no lease held (batches of about
  BATCH_DELAY s each, reported as batch_s);
- resume_s: `resume` called -> the first batch committed after it;
- throttle_error: |achieved - cap| / cap with a cap of CAP rows/s shared by both workers;
- adaptive_batch_error: |median batch time - target| / target over the second half of the
  batches, with CPU work per row and CM_DATA_TARGET_BATCH_S=ADAPTIVE_TARGET (null when
  `RangeJob` has no `target_batch_s`).

The controls run in this process through `tasks.ranges.controls.Controls`, the code the Celery
tasks and `python -m tasks jobs` run, so process start-up is not measured. The last line is
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Engine, delete, func, select, update

from bench.range import BENCH_JOB_MODULES, BENCH_REDIS_DB, ROOT
from devtools.demo import Fleet, reset_database
from devtools.embedded import NotScratch, demo_redis, flush_scratch
from examples.seed import seed_cm_data
from examples.tables import CM_DATA, migrate
from tasks.ranges.jobs import RangeJob
from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS, SCHEDULES, WORK
from tasks.ranges.tables import PartitionStatus as S
from tasks.store.migrate import upgrade
from tasks.store.resources import make_engine

__all__ = ["main"]

CAP = 2000.0  # rows per second for the throttle measurement
BATCH_DELAY = 0.2  # seconds per batch in the pause measurement
ADAPTIVE_TARGET = 0.2  # seconds per batch asked of adaptive sizing (CM_DATA_TARGET_BATCH_S)
POLL = 0.005


def _processed(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(CM_DATA.c.status == 1)).scalar_one())


def _statuses(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(WORK.c.status)).scalars())


def _wait(predicate: Callable[[], Any], timeout: float = 120) -> float:
    """Poll until `predicate` is truthy; the monotonic time it was first seen so."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark step did not finish in time")
        time.sleep(POLL)
    return time.monotonic()


def _reset(engine: Engine, client: redis.Redis) -> None:
    with engine.begin() as conn:
        conn.execute(update(CM_DATA).values(status=0, processed_count=0, processed_fence=0))
        for table in (WORK, SCHEDULES, RANGE_RUNS, RANGE_RUN_EVENTS):
            conn.execute(delete(table))
    flush_scratch(client)


def _fleet(env: dict[str, str], logs: Path, name: str) -> Fleet:
    fleet = Fleet(env, logs)
    for i in range(2):
        fleet.start(f"{name}-w{i}", "worker", "-P", "prefork", "-c", "1", "-n",
                    f"{name}{i}@%h", "--loglevel=INFO")
    fleet.start(f"{name}-beat", "beat", "--loglevel=INFO")
    for i in range(2):
        fleet.wait_ready(f"{name}-w{i}", "ready.", timeout=90)
    return fleet


def _idle(engine: Engine, client: redis.Redis) -> bool:
    from lease.keys import lease_key
    from tasks.ranges.keys import range_lease_name

    with engine.connect() as conn:
        parts = conn.execute(select(WORK.c.part, WORK.c.status)).all()
    return (not any(p.status == S.RUNNING for p in parts)
            and not any(client.exists(lease_key(range_lease_name("cm_data", p.part)))
                        for p in parts))


def measure_start_and_done(engine: Engine, celery: Celery, rows: int) -> dict[str, float]:
    sent = time.monotonic()
    celery.send_task("tasks.ranges.start", ["cm_data"])
    first = _wait(lambda: _processed(engine) > 0)
    last = _wait(lambda: _processed(engine) >= rows)
    done = _wait(lambda: all(s in (S.DONE, S.EMPTY) for s in _statuses(engine)))
    return {"start_to_first_commit_s": first - sent, "last_commit_to_done_s": done - last}


def measure_throttle(engine: Engine, controls: Any, celery: Celery, rows: int) -> float:
    """|achieved - CAP| / CAP between 10% and 70% of the rows, both workers sharing the cap."""
    controls.start("cm_data", "bench")
    controls.throttle("cm_data", CAP, "bench")
    celery.send_task("tasks.ranges.start", ["cm_data"])
    t_a = _wait(lambda: _processed(engine) >= rows // 10)
    done_a = _processed(engine)
    t_b = _wait(lambda: _processed(engine) >= rows * 7 // 10)
    done_b = _processed(engine)
    controls.throttle("cm_data", 0, "bench")
    _wait(lambda: all(s in (S.DONE, S.EMPTY) for s in _statuses(engine)))
    rate = (done_b - done_a) / (t_b - t_a)
    print(f"throttle: {rate:,.0f} rows/s under a cap of {CAP:,.0f}")
    return abs(rate - CAP) / CAP


def measure_pause_resume(engine: Engine, client: redis.Redis, controls: Any,
                         celery: Celery) -> dict[str, float]:
    celery.send_task("tasks.ranges.start", ["cm_data"])
    _wait(lambda: _processed(engine) >= 1000)
    controls.pause("cm_data", "bench")
    asked = time.monotonic()
    paused = _wait(lambda: _idle(engine, client))
    held = _processed(engine)
    time.sleep(1.0)
    resumed_at = time.monotonic()
    controls.resume("cm_data", "bench")
    first = _wait(lambda: _processed(engine) > held)
    controls.cancel("cm_data", "bench")
    _wait(lambda: _idle(engine, client))
    return {"pause_s": paused - asked, "resume_s": first - resumed_at}


def measure_adaptive(engine: Engine, celery: Celery) -> float | None:
    """|median batch time - ADAPTIVE_TARGET| / ADAPTIVE_TARGET over the second half of the
    batches (the time between a partition's checkpoint moves, polled), CPU work per row."""
    celery.send_task("tasks.ranges.start", ["cm_data"])
    seen: dict[int, tuple[int, float]] = {}
    gaps: list[float] = []
    while not all(s in (S.DONE, S.EMPTY) for s in _statuses(engine) or ["x"]):
        with engine.connect() as conn:
            moves = conn.execute(select(WORK.c.part, WORK.c.next_id)).all()
        now = time.monotonic()
        for part, next_id in moves:
            if part in seen and seen[part][0] != next_id:
                gaps.append(now - seen[part][1])
            if part not in seen or seen[part][0] != next_id:
                seen[part] = (next_id, now)
        time.sleep(POLL)
    settled = gaps[len(gaps) // 2:]
    if not settled:
        return None
    median = statistics.median(settled)
    print(f"adaptive batches: median {median:.3f}s for a target of {ADAPTIVE_TARGET}s")
    return abs(median - ADAPTIVE_TARGET) / ADAPTIVE_TARGET


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench control", description=__doc__)
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: a SQLite file)")
    parser.add_argument("--rows", type=int, default=20_000)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-control-"))
    db_url = args.db or f"sqlite:///{workdir}/bench.sqlite"
    try:
        redis_url, embedded = demo_redis(BENCH_REDIS_DB + 1, "bench")
    except NotScratch as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    os.environ.update(REDIS_URL=redis_url, DATABASE_URL=db_url)  # the workers' settings
    engine = make_engine(db_url)
    client = redis.Redis.from_url(redis_url)
    try:
        reset_database(engine)
        upgrade(engine)
        migrate(engine)
        seed_cm_data(engine, args.rows)
        result = _measure(engine, client, redis_url, db_url, args.rows, workdir)
        print(json.dumps(result))
        return 0
    finally:
        client.close()
        engine.dispose()
        if embedded is not None:
            embedded.stop()


def _controls(engine: Engine, client: redis.Redis, celery: Celery) -> Any:
    """The controls of `tasks.ranges.controls` on the bench's database and Redis; a kick
    runs a reconcile round here that sends `run_partition` to the bench's workers."""
    from sqlalchemy.orm import sessionmaker

    import bench.cm_data  # noqa: F401  (registers cm_data here, for the kicks' rounds)
    from tasks.ranges.controls import Controls
    from tasks.ranges.jobs import get_job
    from tasks.ranges.reconciler import reconcile_job

    sessions = sessionmaker(engine, expire_on_commit=False)

    def kick(job: str) -> dict[str, Any]:
        found = reconcile_job(sessions, client, get_job(job),
                              lambda name, part: celery.send_task(
                                  "tasks.ranges.run_partition", [name, part]),
                              interval=1.0, grace=10.0)
        return {"dispatched": found.dispatched}

    return Controls(sessions, client, kick)


def _measure(engine: Engine, client: redis.Redis, redis_url: str, db_url: str, rows: int,
             workdir: Path) -> dict[str, Any]:
    celery = Celery(broker=redis_url, set_as_current=False)
    controls = _controls(engine, client, celery)
    base = dict(os.environ, PYTHONPATH=str(ROOT), EXTRA_TASK_MODULES=BENCH_JOB_MODULES,
                CM_DATA_PARTITION_SIZE=str(max(rows // 2, 1)),
                CM_DATA_BATCH_SIZE="200", CM_DATA_PARALLELISM="1", LEASE_TTL="10",
                RECONCILE_INTERVAL="1")
    result: dict[str, Any] = {"db": engine.dialect.name, "rows": rows, "batch_s": BATCH_DELAY}
    fleets: list[tuple[str, dict[str, str]]] = [
        ("fast", {"CM_DATA_BATCH_DELAY": "0"}),
        ("slow", {"CM_DATA_BATCH_DELAY": str(BATCH_DELAY),
                  "CM_DATA_PARTITION_SIZE": str(max(rows // 4, 1))})]
    result["adaptive_batch_error"] = None
    if "target_batch_s" in RangeJob.__dataclass_fields__:
        fleets.append(("adaptive", {"CM_DATA_BATCH_DELAY": "0", "CM_DATA_WORK": "cpu",
                                    "CM_DATA_TARGET_BATCH_S": str(ADAPTIVE_TARGET)}))
    for name, env in fleets:
        _reset(engine, client)
        fleet = _fleet({**base, **env}, workdir, name)
        try:
            if name == "fast":
                result.update(measure_start_and_done(engine, celery, rows))
                _reset(engine, client)
                result["throttle_error"] = measure_throttle(engine, controls, celery, rows)
            elif name == "slow":
                result.update(measure_pause_resume(engine, client, controls, celery))
            else:
                result["adaptive_batch_error"] = measure_adaptive(engine, celery)
        finally:
            fleet.stop_all()
    celery.close()
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
