"""A platform of real worker and beat processes for the range-job tests on real processes
(`test_chaos`, `test_guarantees_workers`); the `platform` fixture in conftest makes them."""

from __future__ import annotations

import sys
from typing import Any

from sqlalchemy import Engine, func, select

from examples.tables import CM_DATA
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.tables import WorkItem
from tests.support import forkcli
from tests.support.redis_server import RedisServer
from tests.support.workers import (
    CELERY,
    ROOT,
    Proc,
    celery_call,
    platform_env,
    start_worker,
    stop_all,
    wait_until,
)

__all__ = ["Platform", "CELERY_BEAT"]

DATA = CM_DATA
WORK = WorkItem.__table__


class Platform:
    """Worker and beat processes sharing one private Redis and one database."""

    def __init__(self, engine: Engine, redis_server: RedisServer, **env: str) -> None:
        self.engine = engine
        self.redis_server = redis_server
        self.env = platform_env(
            REDIS_URL=redis_server.url, DATABASE_URL=engine.url.render_as_string(False),
            LEASE_TTL="1.5", RECONCILE_INTERVAL="0.5", RANGE_SLICE="60",
            CM_DATA_PARTITION_SIZE="5000", CM_DATA_BATCH_SIZE="200", CM_DATA_BATCH_DELAY="0",
            CM_DATA_PARALLELISM="1",
        )
        self.env.update(env)
        self.procs: list[Proc] = []

    def worker(self, name: str) -> Proc:
        proc = start_worker(self.env, 1, name)
        self.procs.append(proc)
        return proc

    def beat(self, name: str = "beat") -> Proc:
        proc = Proc([*CELERY_BEAT], self.env, name)
        self.procs.append(proc)
        return proc

    def start_job(self, job: str = "cm_data") -> None:
        sent = celery_call(self.env, "tasks.ranges.start", "--args", f'["{job}"]')
        assert sent.returncode == 0, sent.stderr

    def start_held(self, rows_per_s: float, job: str = "cm_data") -> None:
        """Start the job and cap it from the operator CLI before any worker runs it: the run
        cannot end before what a test does to it has landed, however busy the machine."""
        done = forkcli.run([sys.executable, "-m", "tasks", "jobs", "start", job], self.env,
                           ROOT, 60)
        assert done.returncode == 0, done.stderr
        self.throttle(rows_per_s)

    def throttle(self, rows_per_s: float, ended_ok: bool = False) -> None:
        """Cap the job's run (0 lifts the cap) from the operator CLI, which needs no worker:
        tests hold a run back with it until what they do to it has landed. `ended_ok`: the
        run may have succeeded already (a FLUSHALL drops the cap's Redis copy until the next
        reconcile round restores it, and a small run can end in that window)."""
        done = forkcli.run([sys.executable, "-m", "tasks", "jobs", "throttle", "cm_data",
                               str(rows_per_s)], self.env, ROOT, 60)
        if ended_ok and done.returncode != 0 and " is succeeded " in done.stderr:
            return
        assert done.returncode == 0, done.stderr

    def parts(self) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(WORK).order_by(WORK.c.part)).all())

    def finished(self) -> bool:
        parts = self.parts()
        return bool(parts) and all(p.status in (S.DONE, S.EMPTY) for p in parts)

    def wait_finished(self, timeout: float = 120) -> None:
        wait_until(self.finished, timeout, f"all partitions finished: {self.parts()}")

    def running_with_progress(self, batches: int = 2) -> Any:
        for p in self.parts():
            if p.status == S.RUNNING and p.next_id >= p.lo + batches * 200:
                return p
        return None

    def assert_exactly_once(self, rows: int) -> None:
        with self.engine.connect() as conn:
            got = dict(conn.execute(select(DATA.c.processed_count, func.count())
                                    .group_by(DATA.c.processed_count)).all())
        assert got == {1: rows}, f"processed_count histogram {got}"

    def stop(self) -> None:
        stop_all(self.procs)


CELERY_BEAT = [*CELERY, "beat", "--loglevel=INFO"]
