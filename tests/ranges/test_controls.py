"""Range-job controls on real prefork workers and beat (issue 11): pause, resume, cancel,
retry-failed, the run history, and refusals that change nothing.

Each test runs against a private redis-server and one database, with a 1.5 s lease TTL, a
0.5 s reconcile interval and batches that take about BATCH_S.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session, sessionmaker

import bench.cm_data  # noqa: F401  (registers the cm_data job in this process)
from examples.seed import seed_cm_data
from tasks.ranges.controls import ControlRefused, Controls
from tasks.ranges.keys import range_control_key
from tasks.ranges.runs import change_state, current_run
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.tables import RunState
from tasks.store.validate import InvalidArguments
from tests.ranges.cluster import DATA, Platform
from tests.ranges.control_support import (
    control_platform,
    events,
    holders,
    idle,
    jobs_cli,
    processed,
    runs,
    statuses,
)
from tests.support.control_jobs import BOOM
from tests.support.workers import celery_call, wait_until

pytestmark = pytest.mark.timeout(240)

BATCH_S = 0.3  # CM_DATA_BATCH_DELAY: each batch takes a little more than this
# Batches of 50 rows: a partition of 2000 takes 40 batches (12 s), so the run cannot end before
# a control sent through the CLI (a second or more to start a Python process) lands.
SMALL_BATCH = "50"


def _running(cluster: Platform) -> Callable[[], object]:
    """A partition running with two batches committed."""
    return cluster.running_with_progress


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
def test_pause_holds_every_partition_within_a_batch_and_resume_finishes_exactly_once(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 8000)
    # Small batches: the run outlasts the CLI's start-up however busy the machine.
    cluster = control_platform(platform, CM_DATA_PARTITION_SIZE="2000",
                               CM_DATA_BATCH_SIZE=SMALL_BATCH, CM_DATA_BATCH_DELAY=str(BATCH_S))
    cluster.worker("a")
    if engine.dialect.name != "sqlite":  # SQLite runs one writer at a time anyway
        cluster.worker("b")
    cluster.beat()
    cluster.start_job()
    wait_until(_running(cluster), 60, "a partition in progress")
    paused = jobs_cli(cluster, "pause", "cm_data")
    assert paused.returncode == 0, paused.stderr
    asked = time.monotonic()
    wait_until(lambda: idle(cluster), 30, "no partition running, no lease held")
    # The bound (one batch plus 1 s), and the poll's 0.1 s and a loaded machine's
    # scheduling on top.
    assert time.monotonic() - asked <= BATCH_S + 1.0 + 0.5
    # A holder that lost its lease hands its partition back as pending; the reconciler
    # parks it within a round.
    wait_until(lambda: statuses(cluster) <= {S.PAUSED, S.DONE}, 5, "every partition parked")
    held = processed(engine)
    time.sleep(3 * 0.5 + 1.5)  # reconcile rounds and a lease TTL pass: nothing is dispatched
    assert processed(engine) == held and idle(cluster) and not holders(cluster)
    assert runs(engine)[-1].state == RunState.PAUSED
    sent = celery_call(cluster.env, "tasks.ranges.resume", "--args", '["cm_data"]')
    assert sent.returncode == 0, sent.stderr
    cluster.wait_finished()
    cluster.assert_exactly_once(8000)
    wait_until(lambda: runs(engine)[-1].state == RunState.SUCCEEDED, 30, "the run succeeded")
    run = runs(engine)[-1]
    assert run.rows == 8000 and run.finished_at is not None
    assert events(engine) == ["start", "pause", "resume", "succeeded"]


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_cancel_then_start_processes_only_rows_the_filter_still_selects_exactly_once(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 6000)
    cluster = control_platform(platform, CM_DATA_PARTITION_SIZE="2000",
                               CM_DATA_BATCH_SIZE=SMALL_BATCH, CM_DATA_BATCH_DELAY=str(BATCH_S))
    cluster.worker("a")
    cluster.worker("b")
    cluster.beat()
    cluster.start_job()
    wait_until(_running(cluster), 60, "a partition in progress")
    cancelled = jobs_cli(cluster, "cancel", "cm_data")
    assert cancelled.returncode == 0, cancelled.stderr
    wait_until(lambda: idle(cluster), 30, "no partition running, no lease held")
    first = processed(engine)
    assert 0 < first < 6000
    # Rows the filter no longer selects: the new run must leave them alone.
    with engine.begin() as conn:
        skipped = conn.execute(update(DATA).where(DATA.c.status == 0, DATA.c.id % 7 == 0)
                               .values(status=2)).rowcount
    assert skipped > 0
    refused = jobs_cli(cluster, "pause", "cm_data")
    assert refused.returncode == 1 and "cancelled" in refused.stderr
    started = jobs_cli(cluster, "start", "cm_data")
    assert started.returncode == 0, started.stderr
    wait_until(cluster.finished, 120, "the new run finished")
    with engine.connect() as conn:
        got = dict(conn.execute(select(DATA.c.status, func.count())
                                .where(DATA.c.processed_count == 0).group_by(DATA.c.status)).all())
        twice = conn.execute(select(func.count()).where(DATA.c.processed_count > 1)).scalar()
        done = conn.execute(select(func.count()).where(DATA.c.processed_count == 1)).scalar()
    assert got == {2: skipped} and twice == 0 and done == 6000 - skipped
    wait_until(lambda: runs(engine)[-1].state == RunState.SUCCEEDED, 30, "run 2 succeeded")
    old, new = runs(engine)
    assert old.state == RunState.CANCELLED and new.rows == 6000 - skipped - first
    history = jobs_cli(cluster, "runs", "cm_data", "--json")
    assert history.returncode == 0, history.stderr
    assert '"state": "cancelled"' in history.stdout and '"verb": "cancel"' in history.stdout


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_kill_9_of_a_worker_while_paused_then_resume_finishes_exactly_once(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 6000)
    cluster = control_platform(platform, CM_DATA_PARTITION_SIZE="2000",
                               CM_DATA_BATCH_SIZE=SMALL_BATCH, CM_DATA_BATCH_DELAY=str(BATCH_S))
    doomed = cluster.worker("doomed")
    cluster.worker("survivor")
    cluster.beat()
    cluster.start_job()
    wait_until(_running(cluster), 60, "a partition in progress")
    paused = jobs_cli(cluster, "pause", "cm_data")
    assert paused.returncode == 0, paused.stderr
    doomed.kill()  # SIGKILL of the worker and its pool process, maybe mid-batch
    wait_until(lambda: idle(cluster), 30, "no partition running, no lease held")
    assert S.RUNNING not in statuses(cluster)
    resumed = jobs_cli(cluster, "resume", "cm_data")
    assert resumed.returncode == 0, resumed.stderr
    cluster.wait_finished()
    cluster.assert_exactly_once(6000)


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_a_flushed_redis_does_not_unpause_a_paused_job(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 6000)
    cluster = control_platform(platform, CM_DATA_PARTITION_SIZE="2000",
                               CM_DATA_BATCH_SIZE=SMALL_BATCH, CM_DATA_BATCH_DELAY=str(BATCH_S))
    cluster.worker("a")
    cluster.worker("b")
    cluster.beat()
    cluster.start_job()
    wait_until(_running(cluster), 60, "a partition in progress")
    paused = jobs_cli(cluster, "pause", "cm_data")
    assert paused.returncode == 0, paused.stderr
    wait_until(lambda: idle(cluster), 30, "no partition running, no lease held")
    held = processed(engine)
    client = redis.Redis.from_url(cluster.redis_server.url)
    client.flushall()  # the control flag, the leases, the queues: all gone
    # The reconciler writes the flag again from the run row, and dispatches nothing.
    wait_until(lambda: client.hget(range_control_key("cm_data"), "state") == b"paused", 30,
               "the pause flag written again")
    time.sleep(3 * 0.5 + 1.5)
    assert processed(engine) == held and idle(cluster)
    client.close()
    resumed = jobs_cli(cluster, "resume", "cm_data")
    assert resumed.returncode == 0, resumed.stderr
    cluster.wait_finished()
    cluster.assert_exactly_once(6000)


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_retry_failed_resumes_failed_partitions_from_their_checkpoints(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    seed_cm_data(engine, 4000)
    with engine.begin() as conn:
        conn.execute(update(DATA).where(DATA.c.id == 3100).values(payload=BOOM))
    flaky = tmp_path / "flaky"
    flaky.touch()
    cluster = control_platform(platform, TEST_FLAKY_FILE=str(flaky))
    cluster.worker("a")
    cluster.beat()
    sent = celery_call(cluster.env, "tasks.ranges.start", "--args", '["cm_flaky"]')
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: runs(engine, "cm_flaky")[-1].state == RunState.FAILED, 60,
               "the run failed")
    failed = next(p for p in cluster.parts() if p.status == S.FAILED)
    assert failed.part == 1 and failed.next_id == 3001  # batches 2001..3000 committed
    flaky.unlink()
    retried = jobs_cli(cluster, "retry-failed", "cm_flaky")
    assert retried.returncode == 0, retried.stderr
    cluster.wait_finished()
    cluster.assert_exactly_once(4000)
    wait_until(lambda: runs(engine, "cm_flaky")[-1].state == RunState.SUCCEEDED, 30,
               "the run succeeded")
    assert len(runs(engine, "cm_flaky")) == 1
    assert events(engine, "cm_flaky") == ["start", "partition-failed", "failed", "retry-failed",
                                          "succeeded"]
    refused = jobs_cli(cluster, "retry-failed", "cm_flaky")
    assert refused.returncode == 1 and "is succeeded" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


@pytest.fixture
def controls(engine: Engine, redis_client: redis.Redis) -> Controls:
    return Controls(sessionmaker(engine, expire_on_commit=False), redis_client,
                    lambda job: {"dispatched": []})


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_bad_input_is_refused_and_changes_nothing(engine: Engine, controls: Controls,
                                                  redis_client: redis.Redis) -> None:
    with pytest.raises(InvalidArguments, match="unknown range job 'nope'"):
        controls.pause("nope", "t")
    with pytest.raises(ControlRefused, match="no run"):
        controls.pause("cm_data", "t")
    opened = controls.start("cm_data", "t")
    for rate in (-1, "fast", float("nan"), True, None, 1e12):
        with pytest.raises(InvalidArguments, match="rows_per_s"):
            controls.throttle("cm_data", rate, "t")
    with pytest.raises(ControlRefused, match="is running"):
        controls.resume("cm_data", "t")
    with pytest.raises(ControlRefused, match="no failed partitions"):
        controls.retry_failed("cm_data", "t")
    sessions: sessionmaker[Session] = controls.sessions
    with sessions.begin() as session:
        run = current_run(sessions, "cm_data")
        assert run is not None and change_state(session, run, RunState.SUCCEEDED)
    before = (events(engine), runs(engine), redis_client.keys())
    for verb in ("pause", "resume", "cancel", "retry_failed"):
        with pytest.raises(ControlRefused, match=f"run {opened['run']} is succeeded"):
            getattr(controls, verb)("cm_data", "t")
    with pytest.raises(ControlRefused, match="is succeeded"):
        controls.throttle("cm_data", 10, "t")
    assert (events(engine), runs(engine), redis_client.keys()) == before


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_the_cli_refuses_bad_input_with_one_line_and_exit_1(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    cluster = control_platform(platform)
    for args, said in ((["pause", "nope"], "unknown range job"),
                       (["pause", "cm_data"], "has no run"),
                       (["throttle", "cm_data", "-5"], "between 0"),
                       (["throttle", "cm_data", "abc"], "must be a number"),
                       (["runs", "nope"], "unknown range job")):
        out = jobs_cli(cluster, *args)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert runs(engine) == [] and events(engine) == []


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_control_whose_run_changed_under_it_checks_the_new_state_and_tries_again(
        engine: Engine, controls: Controls, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer moves the run between a control's check and its write (here: pause
    lands first, then a reconcile round ends the run): the control checks the run again."""
    controls.start("cm_data", "t")
    sessions: sessionmaker[Session] = controls.sessions
    moves = [RunState.PAUSED]
    checked = controls._run

    def check_then_move(job: str, verb: str, allowed: tuple[str, ...]) -> object:
        run = checked(job, verb, allowed)
        if moves:  # the next state lands after the check, before the control's write
            with sessions.begin() as session:
                assert change_state(session, run, moves.pop(0))
        return run

    monkeypatch.setattr(controls, "_run", check_then_move)
    throttled = controls.throttle("cm_data", 7, "t")  # running -> paused under it: lands
    assert throttled["state"] == RunState.PAUSED and throttled["rows_per_s"] == 7
    assert [r.state for r in runs(engine)] == [RunState.PAUSED]
    assert runs(engine)[-1].rows_per_s == 7
    moves.append(RunState.CANCELLED)
    with pytest.raises(ControlRefused, match="is cancelled"):
        controls.resume("cm_data", "t")  # paused -> cancelled under it: refused anew
    assert events(engine) == ["start", "throttle"]
