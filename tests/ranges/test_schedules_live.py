"""Schedule policies in real time (issue 21): a real leader beat (`celery -A tasks beat`, a tick
every 0.5 s) and a real prefork worker run three jobs scheduled every 10 s whose runs take about
15 s (`tests.support.schedule_jobs`: 75 rows at 5 rows/s), one per policy, side by side; then
the beat is stopped over a due time and started again, and each missed-run policy is followed.

The assertions read what the runs table and the run events recorded (policy, outcome, which
run replaced or followed which), never exact timings, so a busy machine only makes it slower.
tests/ranges/test_schedules.py tests the same policies with a clock the test moves.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from sqlalchemy import Engine, select

from examples.seed import seed_cm_data
from tasks.config.clock import iso
from tasks.ranges.tables import JOB_SCHEDULES, RANGE_RUN_EVENTS, RANGE_RUNS, RunState
from tasks.store.db import utcnow
from tests import SAMPLE_MODULES
from tests.ranges.cluster import Platform
from tests.ranges.control_support import jobs_cli
from tests.support.workers import CELERY, Proc, start_worker, wait_until

pytestmark = pytest.mark.timeout(360)  # beside a 12-process suite it took 202 s

MODULES = f"{SAMPLE_MODULES},tests.support.schedule_jobs"
EVERY_10S = "*/10 * * * * *"
POLICIES = {"sched_skip": "skip", "sched_replace": "replace", "sched_queue": "queue"}
DUE = re.compile(r"due (\S+Z)")


def _runs(engine: Engine, job: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(RANGE_RUNS).where(RANGE_RUNS.c.job == job)
                                 .order_by(RANGE_RUNS.c.id)).all())


def _events(engine: Engine, run_id: int) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        found = conn.execute(select(RANGE_RUN_EVENTS.c.verb, RANGE_RUN_EVENTS.c.actor,
                                    RANGE_RUN_EVENTS.c.detail)
                             .where(RANGE_RUN_EVENTS.c.run_id == run_id)
                             .order_by(RANGE_RUN_EVENTS.c.id)).all()
    return [(verb, actor, detail or "") for verb, actor, detail in found]


def _scheduled(engine: Engine, run_id: int) -> str:
    """The detail of the schedule's fire that started run `run_id` ("" if none did)."""
    return next((d for v, a, d in _events(engine, run_id) if v == "scheduled"), "")


def _schedule(engine: Engine, job: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(JOB_SCHEDULES).where(JOB_SCHEDULES.c.job == job)).one()


def _beat(cluster: Platform, name: str) -> Proc:
    proc = Proc([*CELERY, "beat", "--loglevel=INFO"], cluster.env, name)
    cluster.procs.append(proc)
    proc.wait_for("became leader", timeout=60)
    return proc


def _assert_skip(engine: Engine) -> None:
    """skip: no second run while the first is live; the due times in between are skipped."""
    runs = _runs(engine, "sched_skip")
    assert len(runs) >= 2, runs
    first = runs[0]
    skips = [d for v, a, d in _events(engine, first.id) if v == "schedule-skip"]
    assert skips and all(f"run {first.number} is running" in d for d in skips), skips
    for earlier, later in pairwise(runs):
        assert earlier.finished_at is not None and later.started_at >= earlier.finished_at, (
            earlier, later)
    assert all(_scheduled(engine, r.id).endswith("policy skip") for r in runs)


def _assert_replace(engine: Engine) -> None:
    """replace: the live run is cancelled by the schedule and a new one starts in its place."""
    runs = _runs(engine, "sched_replace")
    assert len(runs) >= 2, runs
    for old, new in pairwise(runs):
        assert old.state == RunState.CANCELLED, old
        assert ("cancel", "schedule") in [(v, a) for v, a, _ in _events(engine, old.id)]
        assert f"replacing run {old.number}" in _scheduled(engine, new.id)
        assert new.started_at >= old.started_at
    assert runs[-1].state in (*RunState.LIVE, RunState.SUCCEEDED, RunState.CANCELLED)


def _assert_queue(engine: Engine) -> None:
    """queue: one due time waits while the first run is live and starts when it ends, once."""
    runs = _runs(engine, "sched_queue")
    assert len(runs) >= 2, runs
    first, second = runs[0], runs[1]
    queued = [d for v, a, d in _events(engine, first.id) if v == "schedule-queue"]
    assert len(queued) == 1 and f"queued until run {first.number} ends" in queued[0], queued
    due = DUE.search(queued[0])
    assert due, queued
    assert first.state == RunState.SUCCEEDED and first.finished_at is not None
    assert second.started_at >= first.finished_at, (first, second)
    assert _scheduled(engine, second.id).startswith(f"due {due.group(1)} (queued)")
    # At most one queued: a due time passed while one waited was skipped, not queued too.
    started_for_it = [r for r in runs if f"due {due.group(1)}" in _scheduled(engine, r.id)]
    assert started_for_it == [second]


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_each_policy_with_a_real_beat_and_worker_and_a_missed_window_after_downtime(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 75)
    # A due time older than 2 s when a tick reads it was missed (the worker's control plane
    # runs the ticks, so its setting counts): only the missed-run policy `skip` cares, and the
    # policy jobs have `once`, so a slow tick starts their runs as before.
    cluster = platform(EXTRA_TASK_MODULES=MODULES, RANGE_SCHEDULE_TICK="0.5",
                       RANGE_SCHEDULE_GRACE="2", RANGE_SLICE="120")
    for job, policy in POLICIES.items():
        done = jobs_cli(cluster, "schedule", job, EVERY_10S, "--policy", policy)
        assert done.returncode == 0, done.stderr
    # Three partitions at a time, and a slot for a replacing run while the old one stops.
    cluster.procs.append(start_worker(cluster.env, 4, "sched"))
    beat = _beat(cluster, "beat-1")
    # The first runs take ~15 s: the queued run starts when the first ends, and the skip
    # job's next run at the first due time after that (~20 s after the first fires).
    wait_until(lambda: len(_runs(engine, "sched_queue")) >= 2, 90, "the queued run")
    wait_until(lambda: len(_runs(engine, "sched_skip")) >= 2, 40, "the skip job's next run")
    _assert_skip(engine)
    _assert_replace(engine)
    _assert_queue(engine)
    _missed_window(cluster, engine, beat)


def _missed_window(cluster: Platform, engine: Engine, beat: Proc) -> None:
    """Stop the beat, let a due time pass, start it again: with the missed-run policy `skip`
    the late due time is recorded as missed and starts nothing; with `once` it starts one run."""
    began = time.monotonic()
    for job in POLICIES:
        assert jobs_cli(cluster, "schedule", job, "--clear").returncode == 0
        jobs_cli(cluster, "cancel", job)  # free the worker's slots (refused if it ended)
    per_call = (time.monotonic() - began) / (2 * len(POLICIES))
    beat.stop()
    # Once a minute, at the second `due` falls on, far enough ahead for both CLI calls at the
    # pace the calls above took (seconds each on a loaded machine); if they still land after
    # it, the schedules are set again for a later second.
    ahead = min(45.0, max(15.0, 4 * per_call + 5))
    for _ in range(4):
        due = (utcnow() + timedelta(seconds=ahead)).replace(microsecond=0)
        for job, missed in (("sched_missed_skip", "skip"), ("sched_missed_once", "once")):
            done = jobs_cli(cluster, "schedule", job, f"{due.second} * * * * *", "--missed",
                            missed)
            assert done.returncode == 0, done.stderr
        if (utcnow() < due and all(_schedule(engine, job).next_due_at == due
                                   for job in ("sched_missed_skip", "sched_missed_once"))):
            break
    else:
        raise AssertionError(f"the schedules could not be set {ahead:.0f} s ahead in four "
                             f"tries ({per_call:.1f} s per CLI call)")
    while utcnow() < due + timedelta(seconds=4):  # past the grace (2 s) with no beat
        time.sleep(0.2)
    _beat(cluster, "beat-2")
    for job in ("sched_missed_skip", "sched_missed_once"):
        wait_until(lambda job=job: _schedule(engine, job).last_due_at == due, 60,
                   f"{job}'s due time {due} to be fired late")
    skipped = _schedule(engine, "sched_missed_skip")
    assert skipped.last_outcome == "missed" and skipped.skipped == 1
    assert _runs(engine, "sched_missed_skip") == []
    once = _schedule(engine, "sched_missed_once")
    (run,) = _runs(engine, "sched_missed_once")
    assert once.last_outcome == f"started run {run.number}" and run.started_by == "schedule"
    assert _scheduled(engine, run.id).startswith(
        f"due {iso(due)}")
    assert run.started_at >= due + timedelta(seconds=4)  # started late, after the downtime
