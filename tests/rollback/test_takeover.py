"""A journal taken over while its owner still runs (issue 9 item 1), in one process.

What a pause past the lease TTL lets happen is done here inside the task, at the exact point
that matters: the journal lease disappears (as if it lapsed, or Redis lost it) and a sweep
runs. The owner then carries on. It must never be reported SUCCESS, must not run an effect
after a refused step, and an effect that lands after its compensation is compensated again.
Run on SQLite, PostgreSQL and MariaDB: the fence is a compare-and-set in the database.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker

from lease import Leases
from lease.keys import fence_key, lease_key
from tasks.celery import app
from tasks.examples.saga import apply_step, ledger
from tasks.rollback.api import checkpoint, set_journal, step
from tasks.rollback.errors import JournalLost, NotInTask
from tasks.rollback.journals import Journal
from tasks.rollback.keys import journal_lease_name
from tasks.rollback.registry import compensation
from tasks.rollback.sweeper import Sweeper, sweep
from tasks.rollback.tables import JOURNAL, OWNERS
from tasks.worker.base import PlatformTask
from tests.rollback.conftest import FAST

pytestmark = pytest.mark.timeout(60)

effects: list[str] = []  # the world: steps whose effect ran, in order
calls: list[str] = []  # every call of the compensation
undone: list[str] = []  # the calls that undid something


@compensation("test.aware")
def _aware(data: dict[str, Any]) -> None:
    """Idempotent, and a no-op for a step whose effect never ran (as compensations must be)."""
    name = data["step"]
    calls.append(name)
    if effects.count(name) > undone.count(name):
        undone.append(name)


def _take_over(task_id: str) -> None:
    """What a pause past the TTL allows: the journal lease is gone and the sweeper runs."""
    found = _current
    assert found is not None and found.leases is not None
    found.leases.client.delete(lease_key(journal_lease_name(task_id)))
    assert sweep(found.sessions, found.leases.client, policy=FAST) == 1


def _do(name: str) -> None:
    with step(name, undo="test.aware", data={"step": name}):
        effects.append(name)


@app.task(name="tests.rollback.lapsing", base=PlatformTask, bind=True)
def lapsing(self: PlatformTask, then: str) -> str:
    _do("reserve")
    _do("charge")
    if then == "ship-late":  # the takeover falls between the intent and its effect
        with step("ship", undo="test.aware", data={"step": "ship"}):
            _take_over(self.request.id)
            effects.append("ship")
        return "shipped"
    if then == "ship-fenced":  # the same, with the example saga's fenced effect
        with step("ship", undo="test.aware", data={"step": "ship"}) as s:
            _take_over(self.request.id)
            assert _current is not None and _current.leases is not None
            apply_step("o-late", "ship", s.fence, client=_current.leases.client)
            effects.append("ship")
        return "shipped"
    _take_over(self.request.id)
    if then == "ship":  # one more step after the takeover
        _do("ship")
    return "done"


@app.task(name="tests.rollback.fine", base=PlatformTask)
def fine() -> str:
    _do("reserve")
    return "ok"


@app.task(name="tests.rollback.not_a_platform_task")
def not_a_platform_task() -> None:
    checkpoint("x", undo="test.aware", data={"step": "x"})


_current: Journal | None = None


@pytest.fixture
def any_journal(engine: Engine, redis_client: redis.Redis) -> Iterator[Journal]:
    """The process journal on SQLite, PostgreSQL or MariaDB, and the flushed test Redis."""
    global _current
    leases = Leases(redis_client)
    _current = Journal(sessionmaker(engine, expire_on_commit=False), leases, lease_ttl=2.0,
                       policy=FAST)
    set_journal(_current)
    effects.clear()
    calls.clear()
    undone.clear()
    yield _current
    set_journal(None)
    _current = None
    leases.keeper.stop()


def rows(j: Journal, task_id: str) -> list[tuple[str, str]]:
    with j.sessions() as session:
        return [(r.name, r.state) for r in session.execute(
            select(JOURNAL).where(JOURNAL.c.task_id == task_id).order_by(JOURNAL.c.seq))]


def owner_state(j: Journal, task_id: str) -> str | None:
    with j.sessions() as session:
        return session.execute(select(OWNERS.c.state)
                               .where(OWNERS.c.task_id == task_id)).scalar()


def test_a_saga_taken_over_while_running_fails_instead_of_succeeding(
    any_journal: Journal, redis_client: redis.Redis
) -> None:
    result = lapsing.apply(args=("return",))
    assert result.state == "FAILURE" and isinstance(result.result, JournalLost), result.result
    assert effects == ["reserve", "charge"]
    assert undone == calls == ["charge", "reserve"]  # by the sweeper, once each
    assert rows(any_journal, result.id) == [("reserve", "compensated"),
                                            ("charge", "compensated")]
    assert owner_state(any_journal, result.id) == "taken_over"
    assert not redis_client.exists(lease_key(journal_lease_name(result.id)))


def test_a_step_after_the_takeover_is_refused_before_its_effect(
    any_journal: Journal
) -> None:
    result = lapsing.apply(args=("ship",))
    assert isinstance(result.result, JournalLost), result.result
    assert effects == ["reserve", "charge"]  # ship never ran
    assert undone == calls == ["charge", "reserve"]
    assert [name for name, _ in rows(any_journal, result.id)] == ["reserve", "charge"]


def test_an_effect_that_lands_after_its_compensation_is_compensated_again(
    any_journal: Journal
) -> None:
    result = lapsing.apply(args=("ship-late",))
    assert isinstance(result.result, JournalLost), result.result
    assert effects == ["reserve", "charge", "ship"]
    # The sweeper's cancel ran before the effect (a no-op), the owner's after it.
    assert calls == ["ship", "charge", "reserve", "ship"]
    assert sorted(undone) == sorted(effects)  # every effect undone exactly once
    assert rows(any_journal, result.id) == [
        ("reserve", "compensated"), ("charge", "compensated"), ("ship", "compensated")]


def test_a_fenced_effect_is_refused_once_the_journal_is_taken_over(
    any_journal: Journal, redis_client: redis.Redis
) -> None:
    """The example saga's effect checks its step's fence in the same script (saga_step.lua),
    so a step whose journal was taken over between its intent and its effect never lands:
    the sweeper's compensations are the last word (nemesis seed 1, nem-saga-224)."""
    result = lapsing.apply(args=("ship-fenced",))
    assert isinstance(result.result, JournalLost), result.result
    assert "refused" in str(result.result)
    assert ledger("o-late", redis_client) == []  # ship never landed
    assert effects == ["reserve", "charge"]
    assert calls == ["ship", "charge", "reserve"]  # the sweeper's, once each
    assert rows(any_journal, result.id) == [
        ("reserve", "compensated"), ("charge", "compensated"), ("ship", "compensated")]


@app.task(name="tests.rollback.fenced", base=PlatformTask)
def fenced(order_id: str) -> None:
    for name in ("reserve_stock", "charge"):
        with step(name, undo="test.aware", data={"step": name}) as s:
            assert _current is not None and _current.leases is not None
            apply_step(order_id, name, s.fence, client=_current.leases.client)


def test_a_fenced_effect_of_the_owner_lands(
    any_journal: Journal, redis_client: redis.Redis
) -> None:
    result = fenced.apply(args=("o-live",))
    assert result.state == "SUCCESS", result.result
    assert ledger("o-live", redis_client) == ["reserve_stock", "charge"]
    assert 0 < redis_client.pttl("saga:o-live")


def test_success_deletes_the_journal_and_leaves_no_key_without_a_ttl(
    any_journal: Journal, redis_client: redis.Redis
) -> None:
    result = fine.apply()
    assert result.state == "SUCCESS" and result.result == "ok"
    assert rows(any_journal, result.id) == [] and owner_state(any_journal, result.id) is None
    name = journal_lease_name(result.id)
    assert not redis_client.exists(lease_key(name))
    assert 0 < redis_client.pttl(fence_key(name)) <= 2000  # the fence key ends too
    assert [k for k in redis_client.keys("*") if redis_client.ttl(k) == -1] == []


def test_checkpoint_needs_a_platform_task(any_journal: Journal) -> None:
    result = not_a_platform_task.apply()
    assert isinstance(result.result, NotInTask) and "PlatformTask" in str(result.result)
    assert effects == [] and calls == []


@app.task(name="tests.rollback.failing", base=PlatformTask)
def failing() -> None:
    _do("reserve")
    raise RuntimeError("boom")


def test_retention_prunes_finished_journals_and_nothing_open(any_journal: Journal) -> None:
    failed = failing.apply()
    assert isinstance(failed.result, RuntimeError) and undone == ["reserve"]
    assert owner_state(any_journal, failed.id) == "rolled_back"
    any_journal.record("t-open", "tests.manual", 0, "reserve", "test.aware", {"step": "x"})
    sweeper = Sweeper(any_journal.sessions)
    assert sweeper.prune(3600.0) == (0, 0)  # younger than the retention
    time.sleep(1.2)
    assert sweeper.prune(1.0) == (1, 1)
    assert rows(any_journal, failed.id) == [] and owner_state(any_journal, failed.id) is None
    # An open journal is never pruned, however old.
    assert rows(any_journal, "t-open") == [("reserve", "recorded")]
    assert owner_state(any_journal, "t-open") == "running"
    any_journal.close("t-open")
