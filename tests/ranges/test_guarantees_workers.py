"""Issue 9 on real worker and beat processes: concurrent inserters committing out of id order,
a poison partition that SIGKILLs its pool process, a Redis restart mid-run, and bad arguments
through `celery call`."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine, func, insert, select, text, update

from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from tasks.deadletters.store import DeadLetters
from tasks.ranges.runner import DEAD_LETTER_KIND
from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.store.db import utcnow
from tests import WORKER_REDIS_URL
from tests.ranges.cluster import Platform
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, celery_call, wait_until

pytestmark = pytest.mark.timeout(240)


def histogram(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(c): int(n) for c, n in conn.execute(
            select(CM_DATA.c.processed_count, func.count()).group_by(CM_DATA.c.processed_count))}


class Inserters:
    """Threads that each insert one row per transaction and hold it open a random while, so
    ids (taken at INSERT from the sequence) commit out of order."""

    def __init__(self, engine: Engine, threads: int) -> None:
        self.engine, self.stop = engine, threading.Event()
        self.lock = threading.Lock()
        self.committed: list[int] = []  # ids in commit order
        self.seen_at: dict[int, datetime] = {}  # id -> a time after its commit (UTC)
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def _run(self, seed: int) -> None:
        rnd = random.Random(seed)
        while not self.stop.is_set():
            with self.engine.begin() as conn:
                row_id = conn.execute(insert(CM_DATA).values(
                    status=0, payload="late", processed_count=0, processed_fence=0)
                    .returning(CM_DATA.c.id)).scalar_one()
                time.sleep(rnd.uniform(0, 0.25))
            with self.lock:
                self.committed.append(int(row_id))
                self.seen_at[int(row_id)] = utcnow()

    def __enter__(self) -> Inserters:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def out_of_order(self) -> int:
        """Commits whose id is below an id committed before them."""
        highest, count = 0, 0
        for row_id in self.committed:
            count += row_id < highest
            highest = max(highest, row_id)
        return count


def closing_began(engine: Engine) -> datetime:
    """When the closing round of the latest run that succeeded began (its event says)."""
    with engine.connect() as conn:
        detail = conn.execute(select(RANGE_RUN_EVENTS.c.detail).where(
            RANGE_RUN_EVENTS.c.verb == RunState.SUCCEEDED)
            .order_by(RANGE_RUN_EVENTS.c.id.desc()).limit(1)).scalar_one()
    stamp = detail.removeprefix("closing round began ").split("Z,")[0]
    return datetime.fromisoformat(stamp)


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
def test_rows_committed_out_of_id_order_during_a_run_are_processed_exactly_once(
    engine: Engine, platform: Callable[..., Platform]
) -> None:
    seed_cm_data(engine, 3000)
    with engine.begin() as conn:  # the seed wrote explicit ids: move the sequence past them
        conn.execute(text("SELECT setval(pg_get_serial_sequence('cm_data', 'id'), 3000)"))
    cluster = platform(CM_DATA_PARTITION_SIZE="1000", CM_DATA_BATCH_SIZE="100",
                       CM_DATA_BATCH_DELAY="0.02", RANGE_SETTLE="1")
    cluster.worker("a")
    cluster.worker("b")
    cluster.beat()
    with Inserters(engine, threads=6) as inserters:
        cluster.start_job()
        # Rows processed (the run may even end while the inserters go on: those rows are
        # the next run's, checked below).
        wait_until(lambda: 1 in histogram(engine), 60, "rows processed")
        time.sleep(10)  # the workers catch up with the inserters and chase them
    assert inserters.out_of_order() > 0, "the inserters never committed out of id order"
    total = 3000 + len(inserters.committed)

    def succeeded() -> bool:  # the run ended on a closing round that found nothing
        with engine.connect() as conn:
            return conn.execute(select(RANGE_RUNS.c.state).order_by(
                RANGE_RUNS.c.id.desc()).limit(1)).scalar() == RunState.SUCCEEDED

    wait_until(succeeded, 90, "the run succeeded")
    # Every row committed before the closing round began was processed; a row left is one
    # committed after it began (the workers may have caught up while inserts went on): the
    # next run's. Its commit was seen after the closing round began.
    began = closing_began(engine)
    with engine.connect() as conn:
        left = conn.execute(select(CM_DATA.c.id).where(CM_DATA.c.status == 0)).scalars().all()
    assert all(inserters.seen_at[i] > began for i in left), (began, left)
    assert histogram(engine) in ({1: total}, {1: total - len(left), 0: len(left)})
    if left:
        cluster.start_job()
        wait_until(succeeded, 90, "the next run succeeded")
    assert histogram(engine) == {1: total}


@pytest.mark.parametrize("db_kind", ["sqlite"], indirect=True)
def test_a_poison_partition_is_failed_and_dead_lettered_after_the_cap(
    engine: Engine, platform: Callable[..., Platform]
) -> None:
    seed_cm_data(engine, 300)
    with engine.begin() as conn:
        conn.execute(update(CM_DATA).where(CM_DATA.c.id == 150).values(payload="poison"))
    cluster = platform(REDELIVERY_CAP="2")
    worker = cluster.worker("a")
    cluster.beat()
    sent = celery_call(cluster.env, "tasks.ranges.start", "--args", '["poison_pill"]')
    assert sent.returncode == 0, sent.stderr

    def poisoned() -> Any:
        parts = cluster.parts()
        return len(parts) == 3 and parts[1].status == S.FAILED and parts[1]

    failed = wait_until(poisoned, 90, f"partition 1 failed: {cluster.parts()}")
    assert "REDELIVERY_CAP=2" in failed.error
    # Two holders died (the first after two batches), the third claim failed it.
    assert (failed.claims, failed.crashes, failed.next_id) == (3, 2, 141)
    wait_until(lambda: [p.status for p in cluster.parts()] == [S.DONE, S.FAILED, S.DONE], 60,
               "the other partitions done")
    assert histogram(engine) == {1: 240, 0: 60}  # 141..200 untouched, nothing twice
    from sqlalchemy.orm import sessionmaker

    [letter] = DeadLetters(sessionmaker(engine)).list(DEAD_LETTER_KIND)
    assert letter.ref == "poison_pill:1" and letter.payload["checkpoint"] == 141
    assert "SIGKILL" in worker.output()  # a pool process really died
    shown = subprocess.run([sys.executable, "-m", "tasks", "status", "--job", "poison_pill"],
                           env={**cluster.env, "COLUMNS": "400"}, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "failed: its holders died 2 times" in shown.stdout
    # No further dispatches: a failed partition stays failed.
    time.sleep(3)
    assert cluster.parts()[1].claims == 3


@pytest.mark.parametrize("broker_too", [False, True], ids=["leases-and-results", "whole-redis"])
def test_a_redis_restart_mid_run_finishes_exactly_once_without_an_operator(
    engine: Engine, platform: Callable[..., Platform], private_redis: RedisServer,
    broker_too: bool,
) -> None:
    """Leases and results on a private Redis that restarts (empty) for about a second; with
    `broker_too` the broker is on it as well (the operator's case: the one Redis of a small
    deployment restarts), so the workers must also survive the broker's restart (item 6)."""
    broker_url = private_redis.url
    if not broker_too:
        broker_url = WORKER_REDIS_URL
        broker = redis.Redis.from_url(WORKER_REDIS_URL)
        broker.flushdb()
        broker.close()
    seed_cm_data(engine, 10_000)
    cluster = platform(BROKER_URL=broker_url, RESULT_BACKEND=private_redis.url,
                       CM_DATA_PARTITION_SIZE="5000", CM_DATA_BATCH_SIZE="200",
                       CM_DATA_BATCH_DELAY="0.05")
    cluster.start_held(400)  # held until the restart has landed, however busy the machine
    cluster.worker("a")
    cluster.worker("b")
    cluster.beat()
    wait_until(cluster.running_with_progress, 60, "a partition in progress")
    private_redis.kill()
    time.sleep(1.0)
    private_redis.start()
    cluster.throttle(0)  # the cap, if the restart left it (the run's row keeps it), lifted
    cluster.wait_finished(timeout=150)
    cluster.assert_exactly_once(10_000)
    parts = cluster.parts()
    assert all(p.status == S.DONE and p.error is None for p in parts)
    # The restart took the running partitions' leases: at least one was resumed by a new claim.
    assert sum(p.claims for p in parts) > len(parts)
    # No process of the platform exited: workers and beat reconnected.
    assert all(proc.popen.poll() is None for proc in cluster.procs), [
        proc.output()[-2000:] for proc in cluster.procs if proc.popen.poll() is not None]
    assert not any("Unrecoverable error" in proc.output() for proc in cluster.procs)


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
def test_out_of_range_and_oversized_arguments_get_short_typed_errors(
    engine: Engine, platform: Callable[..., Platform]
) -> None:
    seed_cm_data(engine, 100)
    cluster = platform()
    cluster.worker("a")
    huge = "j" * 100_000
    cases = [
        ("tasks.ranges.run_partition", f'["cm_data", {10**30}]',
         "partition must be in 0..2147483647, got 1000000000000000000000000000000"),
        ("tasks.ranges.run_partition", f'["{huge}", 0]',
         "job is 100000 characters, at most 64 allowed: 'jjjj"),
        ("tasks.ranges.start", f'["{huge}"]', "job is 100000 characters, at most 64 allowed"),
        ("tasks.ranges.start", '["Bad Name"]', "job name 'Bad Name' must match"),
    ]
    client = Celery(broker=cluster.redis_server.url, backend=cluster.redis_server.url,
                    set_as_current=False)
    try:
        for task, args, message in cases:
            sent = celery_call(cluster.env, task, "--args", args)
            assert sent.returncode == 0, sent.stderr
            result = client.AsyncResult(sent.stdout.strip().splitlines()[-1])
            result.get(timeout=60, propagate=False)
            assert result.state == "FAILURE"
            assert type(result.result).__name__ == "InvalidArguments", result.result
            assert message in str(result.result)
            assert len(str(result.result)) < 200  # a short prefix, never the whole value
    finally:
        client.close()
    assert cluster.parts() == []
    assert "DataError" not in cluster.procs[0].output()
