"""Controls and reconcile rounds never wait behind work (tasks/worker/controlplane.py): the
one-worker quickstart layout, its one slot held by a partition, still takes a `celery call`
pause within a batch and keeps running beat's reconcile rounds."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, select

import bench.cm_data  # noqa: F401  (registers the cm_data job in this process)
from examples.seed import seed_cm_data
from tasks.ranges.keys import range_schedule_name
from tasks.ranges.tables import SCHEDULES, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.worker.controlplane import PREFETCH
from tests.ranges.cluster import Platform
from tests.ranges.control_support import idle, runs
from tests.support.workers import celery_call, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.parametrize("db_kind", ["sqlite"])]

BATCH_S = 0.1
# One batch, the control's own round trip and a busy machine's scheduling: well under the
# time slice (60 s) the held partition keeps its slot for without the control plane.
PAUSE_BOUND_S = BATCH_S + 1.0 + 4.0


def rounds(engine: Engine) -> object:
    """When the job's last reconcile round wrote its schedule row."""
    with engine.connect() as conn:
        return conn.execute(select(SCHEDULES.c.updated_at).where(
            SCHEDULES.c.name == range_schedule_name("cm_data"))).scalar()


def test_one_busy_worker_takes_a_celery_call_pause_within_a_batch_and_keeps_reconciling(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 1000)
    cluster = platform(CM_DATA_PARTITION_SIZE="500", CM_DATA_BATCH_SIZE="20",
                       CM_DATA_BATCH_DELAY=str(BATCH_S))
    cluster.start_held(2)  # 2 rows/s: the partition holds the only slot for its whole slice
    solo = cluster.worker("solo")  # one worker, one slot, every queue: the quickstart layout
    cluster.beat()
    wait_until(lambda: any(p.status == S.RUNNING for p in cluster.parts()), 60,
               "a partition holding the worker's only slot")
    assert "control plane: control consumed on its own channel" in solo.output()
    # Beat's reconcile rounds still run while the slot is held.
    seen = rounds(engine)
    wait_until(lambda: rounds(engine) != seen, 10, "a reconcile round while the slot is held")
    assert any(p.status == S.RUNNING for p in cluster.parts())  # the slot was held all along
    # Beat's rollback sweeps (one per RECONCILE_INTERVAL, 0.5 s here) go to the held pool
    # through the control plane's channel: more ticks than it prefetches pass before the
    # pause, and the pause still lands (superseded sweeps are dropped, not kept waiting).
    time.sleep((PREFETCH + 4) * 0.5)
    assert any(p.status == S.RUNNING for p in cluster.parts())

    sent = celery_call(cluster.env, "tasks.ranges.pause", "--args", '["cm_data"]')
    assert sent.returncode == 0, sent.stderr
    # Timed from the message sent (the CLI has returned), not from the CLI's own start: on a
    # busy machine `celery -A tasks call` alone takes seconds to import before it sends.
    asked = time.monotonic()
    try:
        wait_until(lambda: runs(engine)[-1].state == RunState.PAUSED and idle(cluster), 30,
                   "the job paused")
    except TimeoutError as exc:  # say where it stuck: the run, its partitions, the worker
        raise AssertionError(
            f"{exc}: run {runs(engine)[-1].state}, partitions "
            f"{[(p.part, p.status, p.owner) for p in cluster.parts()]}, celery call said "
            f"{sent.stdout.strip()!r}\n{solo.output()[-4000:]}") from exc
    took = time.monotonic() - asked
    assert took < PAUSE_BOUND_S, f"the pause took {took:.1f}s behind a held slot"
    assert {p.status for p in cluster.parts()} <= {S.PAUSED, S.PENDING, S.DONE, S.EMPTY}

    assert celery_call(cluster.env, "tasks.ranges.resume", "--args", '["cm_data"]') \
        .returncode == 0
    cluster.throttle(0)
    wait_until(lambda: runs(engine)[-1].state == RunState.SUCCEEDED, 90, "the run succeeded")
    cluster.assert_exactly_once(1000)
