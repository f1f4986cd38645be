"""Visit-once range jobs (issue 21): read-only and external-effect jobs.

A job declared `visits="once"` has no filter of rows still to do: its run's plan is made once,
every row present then is visited by exactly one committed batch, the run ends when every
partition's cursor reached its upper bound (no closing read), and `ctx.idempotency_key(row)`
is the same on a retried batch and new in the next run. On real workers: an export into
another table and a fake external service that accepts each key once, each under kill -9 of
the worker holding a batch in flight.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from examples.seed import seed_cm_data
from lease import Leases
from tasks.ranges.controls import Controls
from tasks.ranges.jobs import RangeJob
from tasks.ranges.planning import Partition
from tasks.ranges.reconciler import due_now, reconcile_job
from tasks.ranges.runner import Outcome, PartitionRunner
from tasks.ranges.tables import RANGE_RUNS, WORK, RunState
from tasks.ranges.visits import plan_once
from tests.ranges.cluster import DATA, Platform
from tests.ranges.control_support import jobs_cli, runs
from tests.support.sink import sink
from tests.support.visit_jobs import VISIT_EXPORT, cm_export, recreate
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(180)

MODULES = "bench.cm_data,tests.support.visit_jobs"


def _noop(rows: object, ctx: object) -> None:
    return None


@pytest.mark.parametrize(("kwargs", "said"), [
    ({}, 'declare visits="once"'),
    ({"visits": "sometimes"}, "visits must be one of filter, once"),
    ({"visits": "once", "follow": True}, "follow=True needs a filter"),
])
def test_a_job_that_promises_nothing_is_refused_at_declaration(kwargs: dict[str, object],
                                                               said: str) -> None:
    with pytest.raises(ValueError, match=said):
        RangeJob(name="bad_visits", table=DATA, process=_noop, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("lo", "hi", "size", "parts"), [
    (1, 3000, 1000, [(0, 1, 1000), (1, 1001, 2000), (2, 2001, 3000)]),
    (5, 2500, 1000, [(0, 5, 1000), (1, 1001, 2000), (2, 2001, 2500)]),
    (7, 7, 1000, [(0, 7, 7)]),
    (1001, 1001, 1000, [(1, 1001, 1001)]),
    (None, None, 1000, []),
])
def test_a_visit_once_plan_covers_exactly_the_bounds_read(
        lo: int | None, hi: int | None, size: int, parts: list[tuple[int, int, int]]) -> None:
    assert plan_once(lo, hi, size) == [Partition(*p) for p in parts]


def _round(sessions: sessionmaker[Session], client: redis.Redis, job: RangeJob) -> tuple[
        list[int], object]:
    sent: list[int] = []
    due_now(sessions, job.name)
    done = reconcile_job(sessions, client, job, lambda _j, p: sent.append(p), interval=0.01,
                         grace=0)
    return sent, done


def _run_parts(sessions: sessionmaker[Session], leases: Leases, job: RangeJob,
               parts: list[int]) -> list[str]:
    return [PartitionRunner(job, part, sessions=sessions, leases=leases, lease_ttl=10.0,
                            owner="test", shutdown=threading.Event()).run() for part in parts]


def _copies(engine: Engine) -> Counter[tuple[int, int]]:
    with engine.connect() as conn:
        return Counter(tuple(r) for r in conn.execute(  # type: ignore[misc]
            select(VISIT_EXPORT.c.run, VISIT_EXPORT.c.source_id)).all())


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
def test_a_run_visits_its_plan_once_and_ends_without_a_closing_read(
        engine: Engine, redis_client: redis.Redis, leases: Leases) -> None:
    seed_cm_data(engine, 1500)
    recreate(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    controls = Controls(sessions, redis_client, lambda job: {"dispatched": []})
    first = controls.start("cm_export", "t")["run"]
    sent, planned = _round(sessions, redis_client, cm_export)
    assert sorted(sent) == [0, 1] and planned.planned == 2  # type: ignore[attr-defined]
    with engine.begin() as conn:  # rows above the plan's upper bound: the next run's
        conn.execute(insert(DATA), [{"id": 1500 + i} for i in range(1, 51)])
    again, later = _round(sessions, redis_client, cm_export)
    assert later.planned == 0  # type: ignore[attr-defined]
    assert _run_parts(sessions, leases, cm_export, sorted(set(sent))) == [Outcome.DONE] * 2
    _, closing = _round(sessions, redis_client, cm_export)
    assert closing.run == RunState.SUCCEEDED  # type: ignore[attr-defined]
    assert closing.closing_s is None  # type: ignore[attr-defined]  # no closing read
    assert _copies(engine) == Counter({(first, i): 1 for i in range(1, 1501)})
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).where(DATA.c.status != 0)).scalar() == 0
        assert conn.execute(select(func.max(WORK.c.hi))).scalar() == 1500
    # A second run plans anew and visits every row again, the later ones included.
    second = controls.start("cm_export", "t")
    assert second["replanned"] == 2 and second["run"] != first
    sent, _ = _round(sessions, redis_client, cm_export)
    assert _run_parts(sessions, leases, cm_export, sent) == [Outcome.DONE] * 2
    _, closing = _round(sessions, redis_client, cm_export)
    assert closing.run == RunState.SUCCEEDED  # type: ignore[attr-defined]
    copies = _copies(engine)
    assert copies == Counter({**{(first, i): 1 for i in range(1, 1501)},
                              **{(second["run"], i): 1 for i in range(1, 1551)}})
    assert [r.state for r in runs(engine, "cm_export")] == [RunState.SUCCEEDED] * 2


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_an_empty_table_ends_its_run_at_once(engine: Engine, redis_client: redis.Redis) -> None:
    sessions = sessionmaker(engine, expire_on_commit=False)
    recreate(engine)
    Controls(sessions, redis_client, lambda job: {"dispatched": []}).start("cm_export", "t")
    _, done = _round(sessions, redis_client, cm_export)
    assert done.planned == 0 and done.run == RunState.SUCCEEDED  # type: ignore[attr-defined]
    with engine.connect() as conn:
        assert conn.execute(select(RANGE_RUNS.c.planned_at)).scalar() is not None


def _hold_env(tmp_path: Path, after: int) -> tuple[Path, dict[str, str]]:
    hold = tmp_path / "hold"
    hold.write_text("")
    return hold, {"VISIT_HOLD_FILE": str(hold), "VISIT_HOLD_AFTER": str(after)}


def _held_ids(hold: Path) -> list[int]:
    marker = Path(f"{hold}.held")
    return wait_until(lambda: marker.exists() and marker.read_text()
                      and json.loads(marker.read_text()), 60, "a batch held in flight")


def _succeeded(engine: Engine, job: str, count: int) -> Callable[[], bool]:
    return lambda: [r.state for r in runs(engine, job)] == [RunState.SUCCEEDED] * count


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_an_export_visits_every_row_once_under_kill_9(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    seed_cm_data(engine, 3000)
    recreate(engine)
    hold, env = _hold_env(tmp_path, 300)
    cluster = platform(EXTRA_TASK_MODULES=MODULES, **env)
    doomed = cluster.worker("doomed")
    cluster.beat()
    assert jobs_cli(cluster, "start", "cm_export").returncode == 0
    held = _held_ids(hold)  # its batch inserted its copies and has not committed
    doomed.kill()
    hold.unlink()
    cluster.worker("survivor")
    wait_until(_succeeded(engine, "cm_export", 1), 60, "the run to succeed")
    (run,) = runs(engine, "cm_export")
    assert _copies(engine) == Counter({(run.id, i): 1 for i in range(1, 3001)})
    assert run.rows == 3000
    taken = [p for p in cluster.parts() if p.lo <= held[0] <= p.hi]
    assert taken[0].claims >= 2, "the killed holder's partition was not taken over"
    with engine.connect() as conn:
        fences = dict(conn.execute(select(VISIT_EXPORT.c.source_id, VISIT_EXPORT.c.fence)
                                   .where(VISIT_EXPORT.c.source_id.in_(held))).all())
        assert conn.execute(select(func.count()).where(DATA.c.status != 0)).scalar() == 0
    assert min(fences.values()) > 1  # the held batch's rows were copied by the next holder


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_external_effects_carry_keys_a_retried_batch_reuses_and_a_new_run_renews(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    seed_cm_data(engine, 1000)
    hold, env = _hold_env(tmp_path, 300)
    with sink() as service:
        cluster = platform(EXTRA_TASK_MODULES=MODULES, VISIT_SINK_URL=service.url, **env)
        doomed = cluster.worker("doomed")
        cluster.beat()
        assert jobs_cli(cluster, "start", "cm_notify").returncode == 0
        held = _held_ids(hold)  # its keys are sent, its batch not committed
        doomed.kill()
        hold.unlink()
        cluster.worker("survivor")
        wait_until(_succeeded(engine, "cm_notify", 1), 60, "run 1 to succeed")
        again = jobs_cli(cluster, "start", "cm_notify")
        assert again.returncode == 0, again.stderr
        wait_until(_succeeded(engine, "cm_notify", 2), 60, "run 2 to succeed")
        offers, accepted = service.snapshot()
    first, second = (r.id for r in runs(engine, "cm_notify"))
    expected = {f"cm_notify:{run}:{i}" for run in (first, second) for i in range(1, 1001)}
    assert len(accepted) == len(set(accepted)) == 2000 and set(accepted) == expected
    # The retried batch offered the same keys again (the receiver dropped them); nothing else
    # was offered twice.
    assert {k for k, n in offers.items() if n > 1} == {f"cm_notify:{first}:{i}" for i in held}
    assert max(offers.values()) == 2
