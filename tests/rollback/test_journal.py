"""Checkpoints and rollback in one process: order, signals, at-most-once, validation, errors.

Tasks run through Celery's own tracer (`Task.apply`), which fires task_success and
task_failure exactly as a worker does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import select

from lease.keys import lease_key
from tasks.celery import app
from tasks.deadletters.store import DeadLetters
from tasks.rollback.api import checkpoint, set_journal
from tasks.rollback.errors import NotInTask, UnknownCompensation
from tasks.rollback.journals import Journal
from tasks.rollback.keys import journal_lease_name
from tasks.rollback.registry import compensation
from tasks.rollback.signals import (
    checkpoint_recorded,
    rollback_finished,
    rollback_started,
    rollback_step_failed,
    rollback_step_succeeded,
)
from tasks.rollback.tables import JOURNAL, JournalState
from tasks.worker.base import PlatformTask

pytestmark = pytest.mark.timeout(60)

undone: list[str] = []
flaky_calls: dict[str, int] = {}


@compensation("test.undo")
def _undo(data: dict[str, Any]) -> None:
    undone.append(data["step"])


@compensation("test.broken")
def _broken(data: dict[str, Any]) -> None:
    raise RuntimeError(f"cannot undo {data['step']}")


@compensation("test.flaky")
def _flaky(data: dict[str, Any]) -> None:
    calls = flaky_calls[data["step"]] = flaky_calls.get(data["step"], 0) + 1
    if calls <= data["fails"]:
        raise ConnectionError("payment service unavailable")
    undone.append(data["step"])


@app.task(name="tests.rollback.saga", base=PlatformTask, soft_time_limit=5, time_limit=10)
def saga(steps: list[list[Any]], fail: bool) -> None:
    for name, undo, extra in steps:
        checkpoint(name, undo=undo, data={"step": name, **extra})
    if fail:
        raise RuntimeError("boom")


@app.task(name="tests.rollback.record_one", base=PlatformTask, soft_time_limit=5,
          time_limit=10)
def record_one(undo: str, data: Any) -> None:
    checkpoint("only", undo=undo, data=data)


@app.task(name="tests.rollback.plain", soft_time_limit=5, time_limit=10)
def plain(fail: bool) -> str:
    if fail:
        raise RuntimeError("plain failure")
    return "ok"


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    undone.clear()
    flaky_calls.clear()
    yield


@pytest.fixture
def events() -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []
    receivers = []
    for signal, key in ((checkpoint_recorded, "seq"), (rollback_started, "seqs"),
                        (rollback_step_succeeded, "seq"), (rollback_step_failed, "seq"),
                        (rollback_finished, "reason")):
        def receiver(sender: Any, _n: str = str(signal.name), _k: str = key,
                     **kwargs: Any) -> None:
            seen.append((_n, kwargs[_k]))
        signal.connect(receiver, weak=False)
        receivers.append((signal, receiver))
    yield seen
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def rows(journal: Journal, task_id: str | None = None) -> list[Any]:
    query = select(JOURNAL).order_by(JOURNAL.c.seq)
    if task_id is not None:
        query = query.where(JOURNAL.c.task_id == task_id)
    with journal.sessions() as session:
        return list(session.execute(query).all())


STEPS = [["reserve", "test.undo", {}], ["charge", "test.undo", {}], ["ship", "test.undo", {}]]


def test_failure_undoes_the_steps_in_reverse_with_signals_in_order(
    journal: Journal, redis_client: redis.Redis, events: list[tuple[str, Any]]
) -> None:
    result = saga.apply(args=(STEPS, True))
    assert isinstance(result.result, RuntimeError)
    assert undone == ["ship", "charge", "reserve"]
    assert events == [
        ("checkpoint_recorded", 1), ("checkpoint_recorded", 2), ("checkpoint_recorded", 3),
        ("rollback_started", [3, 2, 1]),
        ("rollback_step_succeeded", 3), ("rollback_step_succeeded", 2),
        ("rollback_step_succeeded", 1),
        ("rollback_finished", "task failed: RuntimeError('boom')"),
    ]
    found = rows(journal, result.id)
    assert [(r.name, r.state, r.attempt) for r in found] == [
        ("reserve", "compensated", 0), ("charge", "compensated", 0), ("ship", "compensated", 0)]
    assert json.loads(found[0].data) == {"step": "reserve"}
    assert not redis_client.exists(lease_key(journal_lease_name(result.id)))
    assert not journal.holds(result.id)


def test_success_discards_the_journal_without_compensating(
    journal: Journal, redis_client: redis.Redis, events: list[tuple[str, Any]]
) -> None:
    result = saga.apply(args=(STEPS, False))
    assert result.successful()
    assert undone == [] and rows(journal) == []
    assert [name for name, _ in events] == ["checkpoint_recorded"] * 3
    assert not redis_client.exists(lease_key(journal_lease_name(result.id)))


class CountingSessions:
    """Stands in for a sessionmaker and counts every use."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise AssertionError("database used")

    begin = __call__


class CountingRedis:
    def __init__(self) -> None:
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        self.calls += 1
        raise AssertionError(f"redis used: {name}")


def test_a_task_without_checkpoints_does_no_io() -> None:
    sessions, client = CountingSessions(), CountingRedis()
    set_journal(Journal(sessions, client, lease_ttl=2.0))  # type: ignore[arg-type]
    try:
        assert plain.apply(args=(False,)).result == "ok"
        assert isinstance(plain.apply(args=(True,)).result, RuntimeError)
    finally:
        set_journal(None)
    assert sessions.calls == 0 and client.calls == 0


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"when": object()}, TypeError),
        ({"x": float("nan")}, TypeError),
        ({1: "int key"}, TypeError),
        ({"pair": (1, 2)}, TypeError),
        (["not", "a", "dict"], TypeError),
    ],
)
def test_non_json_data_is_rejected_before_anything_is_written(
    journal: Journal, redis_client: redis.Redis, data: Any, error: type[Exception]
) -> None:
    result = record_one.apply(args=("test.undo", data))
    assert isinstance(result.result, error), result.result
    assert rows(journal) == []
    assert redis_client.keys("lease:*") == []


def test_an_unknown_compensation_is_rejected_at_checkpoint_time(
    journal: Journal, redis_client: redis.Redis
) -> None:
    result = record_one.apply(args=("no.such.undo", {"a": 1}))
    assert isinstance(result.result, UnknownCompensation)
    assert isinstance(result.result, ValueError) and "no.such.undo" in str(result.result)
    assert rows(journal) == [] and redis_client.keys("lease:*") == []


def test_checkpoint_outside_a_task_is_refused(journal: Journal) -> None:
    with pytest.raises(NotInTask):
        checkpoint("x", undo="test.undo", data={})


def test_rollback_runs_each_step_once_under_concurrent_and_repeated_calls(
    journal: Journal, events: list[tuple[str, Any]]
) -> None:
    for step in ("a", "b", "c", "d", "e"):
        journal.record("t-1", "tests.manual", 0, step, "test.undo", {"step": step})
    events.clear()
    barrier = threading.Barrier(8)
    reports = []

    def run() -> None:
        barrier.wait()
        reports.append(journal.rollback("t-1", "concurrent"))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert undone == ["e", "d", "c", "b", "a"]
    assert sorted(seq for r in reports for seq in r.compensated) == [1, 2, 3, 4, 5]
    assert [n for n, _ in events].count("rollback_step_succeeded") == 5
    assert {r.state for r in rows(journal, "t-1")} == {JournalState.COMPENSATED}
    events.clear()
    again = journal.rollback("t-1", "again")
    assert again.steps == () and events == [] and undone == ["e", "d", "c", "b", "a"]
    journal.close("t-1")


def test_a_failing_compensation_is_retried_then_dead_lettered_and_the_rest_still_run(
    journal: Journal, events: list[tuple[str, Any]]
) -> None:
    steps = [["reserve", "test.undo", {}], ["charge", "test.broken", {}],
             ["notify", "test.flaky", {"fails": 2}]]
    result = saga.apply(args=(steps, True))
    assert undone == ["notify", "reserve"]
    assert flaky_calls == {"notify": 3}
    found = {r.name: r for r in rows(journal, result.id)}
    assert found["charge"].state == JournalState.DEAD
    assert "cannot undo charge" in found["charge"].error
    assert found["notify"].state == found["reserve"].state == JournalState.COMPENSATED
    letters = DeadLetters(journal.sessions).list("compensation")
    assert [(x.ref, x.payload["compensation"]) for x in letters] == [
        (f"{result.id}:2", "test.broken")]
    assert "4 time(s)" in letters[0].reason  # the first call and 3 retries
    assert ("rollback_step_failed", 2) in events
    assert [n for n, _ in events][-1] == "rollback_finished"
