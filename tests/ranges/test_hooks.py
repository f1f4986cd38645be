"""Hooks of range jobs (issue 21): `on_success`, `on_failure`, `on_cancel` run exactly once per
run end, through the run row's outbox (tasks.ranges.outbox), retried when they raise.

The in-process tests run the real hook task (`tasks.ranges.hook`, applied here with the task
id the outbox claimed) against a real database; the last one runs everything on real prefork
workers and kills the worker that ran the last partition while it runs the hook.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import signature
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from tasks.ranges.controls import Controls
from tasks.ranges.jobs import _JOBS, RangeJob, register
from tasks.ranges.outbox import Again, Owed, claim, deliver, owed, run_hook
from tasks.ranges.runs import change_state, current_run, events_of, writing
from tasks.ranges.tables import RANGE_RUNS, RunState
from tests.ranges.cluster import Platform
from tests.ranges.control_support import runs
from tests.support.hook_jobs import log_lines
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def db_kind() -> str:
    """SQLite unless a test names its databases: the logic is the database's compare-and-set
    UPDATEs, which PostgreSQL runs too where it matters."""
    return "sqlite"

CALLS: list[tuple[str, dict[str, Any]]] = []
FAILS: dict[str, int] = {}  # hook -> how many more tries raise


def _hook(name: str) -> Callable[[dict[str, Any]], None]:
    def hook(run: dict[str, Any]) -> None:
        CALLS.append((name, run))
        if FAILS.get(name, 0) > 0:
            FAILS[name] -= 1
            raise ConnectionError(f"{name} is down")
    return hook


def _noop(rows: Any, ctx: Any) -> None:
    raise AssertionError("no partition runs in these tests")


@pytest.fixture
def job() -> Iterator[RangeJob]:
    found = register(RangeJob(
        name="hooked_here", table=CM_DATA, where=CM_DATA.c.status == 0, process=_noop,
        on_success=_hook("success"), on_failure=_hook("failure"), on_cancel=_hook("cancel")))
    CALLS.clear()
    FAILS.clear()
    yield found
    _JOBS.pop(found.name, None)


@pytest.fixture
def controls(sessions: sessionmaker[Session], redis_client: Any) -> Controls:
    return Controls(sessions, redis_client, lambda job: {})


def _end(sessions: sessionmaker[Session], job: str, to: str) -> int:
    """End the job's run as the closing round does (`change_state` in its transaction)."""
    run = current_run(sessions, job)
    assert run is not None
    with writing(sessions) as session:
        assert change_state(session, run, to)
    return run.id


class Hooks:
    """The hook task's body (`run_hook`) on the test's database, its retries run at once
    under the same task id (as Celery's retry keeps it)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def apply(self, run_id: int, state: str, task_id: str) -> dict[str, Any]:
        from tasks.celery import app
        from tasks.ranges.tasks import _hook_of

        retries = 0
        while True:
            try:
                return run_hook(self.sessions, app, _hook_of, run_id, state, task_id, retries)
            except Again:
                retries += 1

    def deliver(self, send: Callable[[int, str, str], object] | None = None,
                resend: float = 3600.0) -> list[int]:
        from tasks.ranges.tasks import _declared

        return deliver(self.sessions, send or self.apply, resend, _declared)


def hooks(sessions: sessionmaker[Session]) -> Hooks:
    return Hooks(sessions)


def _verbs(sessions: sessionmaker[Session], run_id: int) -> list[str]:
    return [e.verb for e in events_of(sessions, [run_id])[run_id]]


@pytest.mark.parametrize("bad, says", [
    (42, "must be a callable"),
    ({"kwargs": {}}, "needs a task name under 'task'"),
    ("not a task", "is not a task name"),
    (signature("tasks.ranges.start", args=[object()]), "must be JSON-serialisable"),
])
def test_a_bad_hook_declaration_is_refused_at_declaration(bad: object, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        RangeJob(name="bad_hook", table=CM_DATA, where=CM_DATA.c.status == 0, process=_noop,
                 on_failure=bad)
    assert "range job bad_hook: on_failure" in str(refused.value)
    assert "bad_hook" not in _JOBS


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"])
def test_each_end_runs_its_hook_once_with_the_run_summary(
        job: RangeJob, sessions: sessionmaker[Session], controls: Controls) -> None:
    controls.start(job.name, "me@here")
    first = _end(sessions, job.name, RunState.SUCCEEDED)
    controls.start(job.name, "me@here")
    controls.cancel(job.name, "me@here")
    second = current_run(sessions, job.name).id  # type: ignore[union-attr]
    controls.start(job.name, "me@here")
    third = _end(sessions, job.name, RunState.FAILED)
    assert hooks(sessions).deliver() == [first, second, third]
    assert [(name, run["run"], run["state"]) for name, run in CALLS] == [
        ("success", first, "succeeded"), ("cancel", second, "cancelled"),
        ("failure", third, "failed")]
    assert CALLS[0][1]["job"] == job.name and CALLS[0][1]["hook"] == "on_success"
    json.dumps(CALLS[0][1])  # the summary a signature hook would carry
    # Owed no more: the next reconcile rounds send nothing, and nothing runs again.
    assert hooks(sessions).deliver() == [] and len(CALLS) == 3
    assert _verbs(sessions, first) == ["start", "hook"]


def test_a_hook_that_raises_is_retried_and_one_that_keeps_failing_is_recorded(
        job: RangeJob, sessions: sessionmaker[Session], controls: Controls) -> None:
    controls.start(job.name, "me@here")
    ok = _end(sessions, job.name, RunState.SUCCEEDED)
    FAILS["success"] = 2
    hooks(sessions).deliver()
    assert [name for name, _ in CALLS] == ["success"] * 3
    assert _verbs(sessions, ok).count("hook") == 1
    controls.start(job.name, "me@here")
    bad = _end(sessions, job.name, RunState.FAILED)
    FAILS["failure"] = 100
    sent: list[tuple[int, str, str]] = []
    assert hooks(sessions).deliver(lambda *message: sent.append(message)) == [bad]
    with pytest.raises(ConnectionError):
        hooks(sessions).apply(*sent[0])
    assert [name for name, _ in CALLS].count("failure") == 6  # the first try and 5 retries
    events = events_of(sessions, [bad])[bad]
    assert events[-1].verb == "hook-failed" and "failed after 6 tries" in str(events[-1].detail)
    assert hooks(sessions).deliver() == []  # given up for good, recorded, not sent again


def test_a_hook_lost_between_claim_and_send_is_sent_again_and_runs_once(
        job: RangeJob, sessions: sessionmaker[Session], controls: Controls) -> None:
    controls.start(job.name, "me@here")
    run_id = _end(sessions, job.name, RunState.SUCCEEDED)
    lost: list[str] = []
    # The claim commits, then the process dies before its message is sent.
    assert hooks(sessions).deliver(lambda _r, _s, task_id: lost.append(task_id)) == [run_id]
    assert hooks(sessions).deliver() == [] and not CALLS  # claimed: not sent twice meanwhile
    # A send that fails (the broker away) gives its claim back: the next round sends it.
    def refused(_r: int, _s: str, _t: str) -> None:
        raise ConnectionError("broker away")

    with writing(sessions) as session:  # as if the claim above had not been made
        session.execute(update(RANGE_RUNS).where(RANGE_RUNS.c.id == run_id)
                        .values(hook_task=None))
    assert hooks(sessions).deliver(refused) == []
    assert [o.task for o in owed(sessions, 3600.0)] == [None]
    assert hooks(sessions).deliver(lambda _r, _s, task_id: lost.append(task_id)) == [run_id]
    # A second claimer that read the row before the first claim loses the compare-and-set.
    assert not claim(sessions, Owed(run_id, job.name, RunState.SUCCEEDED, None), "late")
    # RANGE_HOOK_RESEND later it is sent again, under a new task id.
    resent: list[str] = []

    def send(run: int, state: str, task_id: str) -> None:
        resent.append(task_id)
        hooks(sessions).apply(run, state, task_id)

    assert hooks(sessions).deliver(send, resend=0.0) == [run_id]
    assert len(CALLS) == 1 and resent[0] != lost[0]
    # The lost message, delivered after all, and the new one delivered twice: no-ops.
    assert hooks(sessions).apply(run_id, RunState.SUCCEEDED, lost[0])["outcome"] == "not owed"
    assert hooks(sessions).apply(run_id, RunState.SUCCEEDED, resent[0])["outcome"] == "not owed"
    assert len(CALLS) == 1 and owed(sessions, 0.0) == []


def test_a_job_without_hooks_only_clears_its_outbox(
        sessions: sessionmaker[Session], redis_client: Any) -> None:
    plain = register(RangeJob(name="plain_here", table=CM_DATA, where=CM_DATA.c.status == 0,
                              process=_noop))
    try:
        Controls(sessions, redis_client, lambda job: {}).start(plain.name, "me@here")
        run_id = _end(sessions, plain.name, RunState.SUCCEEDED)
        sent: list[int] = []
        assert hooks(sessions).deliver(lambda r, _s, _t: sent.append(r)) == [] and not sent
        with sessions() as session:
            assert session.execute(select(RANGE_RUNS.c.hook).where(
                RANGE_RUNS.c.id == run_id)).scalar() is None
    finally:
        _JOBS.pop(plain.name, None)


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_the_hook_runs_once_when_the_worker_that_ended_the_run_is_killed_in_it(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    """One worker runs the job's partitions and ends the run; it is killed -9 inside the
    hook's first try. Another worker takes the hook over after RANGE_HOOK_RESEND; its first
    try raises and is retried: the hook completes exactly once."""
    seed_cm_data(engine, 1000)
    log, stall = tmp_path / "hooks.log", tmp_path / "stall"
    stall.touch()
    cluster = platform(EXTRA_TASK_MODULES="bench.cm_data,tests.support.hook_jobs",
                       TEST_HOOK_LOG=str(log), TEST_HOOK_STALL=str(stall),
                       TEST_HOOK_RAISE_AT="2", RANGE_HOOK_RESEND="2")
    first = cluster.worker("a")
    cluster.beat()
    cluster.start_job("cm_hooked")
    wait_until(lambda: log_lines(log), 60, "the hook's first try")
    assert runs(engine, "cm_hooked")[-1].state == RunState.SUCCEEDED
    first.kill()
    stall.unlink()
    cluster.worker("b")
    wait_until(lambda: any(w[0] == "done" for w in log_lines(log)), 60, "the hook completed")
    run_id = runs(engine, "cm_hooked")[-1].id
    lines = log_lines(log)
    assert [w[:3] for w in lines] == [["try", str(run_id), "succeeded"]] * 3 + [
        ["done", str(run_id), "succeeded"]], lines
    assert lines[0][3] != lines[1][3]  # the killed worker's try, then the other's
    cluster.assert_exactly_once(1000)
    verbs = [e.verb for e in _run_events(engine, run_id)]
    assert verbs.count("hook") == 1 and "hook-failed" not in verbs


def _run_events(engine: Engine, run_id: int) -> list[Any]:
    return events_of(sessionmaker(engine), [run_id])[run_id]


def _sent(client: Any, queue: str) -> tuple[str, list[Any]]:
    """The task name and arguments of the one message waiting on `queue` (Redis broker)."""
    import base64

    raw = client.lpop(queue)
    assert raw is not None, f"no message on {queue}"
    message = json.loads(raw)
    args = json.loads(base64.b64decode(message["body"]))[0]
    return message["headers"]["task"], args


def test_a_signature_hook_is_sent_with_the_summary_first_unless_immutable() -> None:
    """What the hook task sends for a signature hook, read off the real broker: `.s()`
    receives the run summary first (as a Celery link callback receives a result), an
    immutable one (starting the next job) is sent as declared."""
    import redis

    from tasks.celery import app, settings
    from tasks.ranges.hooks import call

    client = redis.Redis.from_url(settings.broker_url)
    run = {"job": "a", "run": 7, "state": "succeeded"}
    try:
        client.delete("celery", "control")
        chained = signature("tasks.ranges.start", args=["next_job"], immutable=True)
        assert call(app, chained, run).startswith("sent tasks.ranges.start as task ")
        assert _sent(client, "control") == ("tasks.ranges.start", ["next_job"])
        notify = signature("myapp.notify", kwargs={"channel": "ops"})
        call(app, notify, run)
        assert _sent(client, "celery") == ("myapp.notify", [run])
    finally:
        client.delete("celery", "control")
        client.close()
