"""A redelivered saga whose first delivery died inside its own rollback (nemesis seed 1,
nem-saga-310).

The broker connection is cut while a saga runs: the first delivery's Redis calls fail, the
task fails and its own rollback claims its newest step; then Celery's
worker_cancel_long_running_tasks_on_connection_loss SIGTERMs the pool process inside that
compensation, and the restored message is delivered again at once. The new delivery opens a
journal whose newest step is 'compensating' under a dead owner and whose older step is still
'recorded'. It must take the journal over by compare-and-set and compensate every step the
first delivery journaled, newest first, each exactly once, BEFORE its own first step; the
first delivery's claimer, if it wakes up, is fenced and changes nothing. Before the fix the
leftover rollback saw the 'compensating' step, reported "handed over", and the saga ran
again with the first attempt's reserve_stock and charge never undone.
Run on SQLite, PostgreSQL and MariaDB: the fence is the owners row.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker

from lease import Leases
from lease.keys import lease_key
from tasks.deadletters.store import DeadLetters
from tasks.rollback.api import rollback
from tasks.rollback.errors import JournalLost
from tasks.rollback.journals import Journal
from tasks.rollback.keys import journal_lease_name
from tasks.rollback.registry import compensation
from tasks.rollback.runner import RollbackReport
from tasks.rollback.signals import rollback_started
from tasks.rollback.sweeper import Candidate, Sweeper
from tasks.rollback.tables import JOURNAL, OWNERS
from tests.rollback.conftest import FAST, process_journal
from tests.rollback.platform import Platform, pool_children
from tests.support.sagas import undo_calls_key
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(60)

FIRST = "first-delivery-rollback"  # the thread of the first delivery's own rollback
GATE = "redelivery-gate"  # set by the test: the first delivery's claimer wakes up

_redis: redis.Redis | None = None
effects: list[str] = []  # the world: steps whose effect ran, in order
undone: list[str] = []  # the compensations that undid something, in order
entered = threading.Event()  # the first delivery's rollback is inside the gated compensation


def _undo(name: str) -> None:
    """Idempotent, and a no-op for a step whose effect never ran."""
    if effects.count(name) > undone.count(name):
        undone.append(name)


@compensation("test.redelivery_refund")
def _refund(data: dict[str, Any]) -> None:
    """In the first delivery's rollback thread it hangs until the gate opens, then fails (its
    process was SIGTERMed there; here it wakes up later, to show it is fenced)."""
    if threading.current_thread().name == FIRST:
        entered.set()
        deadline = time.monotonic() + 20
        assert _redis is not None
        while not _redis.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.02)
        raise ConnectionError("the first delivery's Redis connection was cut")
    _undo(data["step"])


@compensation("test.redelivery_release")
def _release(data: dict[str, Any]) -> None:
    _undo(data["step"])


@pytest.fixture
def first(engine: Engine, redis_client: redis.Redis) -> Iterator[Journal]:
    """The first delivery's process journal on SQLite, PostgreSQL or MariaDB."""
    global _redis
    _redis = redis_client
    effects.clear()
    undone.clear()
    entered.clear()
    with process_journal(engine, redis_client) as found:
        yield found
    _redis = None


@pytest.fixture
def second(engine: Engine, redis_client: redis.Redis) -> Iterator[Journal]:
    """The redelivery's journal: another pool process (its own leases, its own sessions)."""
    leases = Leases(redis_client)
    yield Journal(sessionmaker(engine, expire_on_commit=False), leases, lease_ttl=2.0,
                  policy=FAST)
    leases.keeper.stop()


def _do(j: Journal, task_id: str, name: str, undo: str) -> None:
    """One saga step of delivery `j`: journaled before its effect (write-ahead)."""
    with j.step(task_id, "tests.redelivered", 0, name, undo, {"step": name}):
        effects.append(name)


def _rows(j: Journal, task_id: str) -> list[tuple[int, str, str]]:
    with j.sessions() as session:
        return [(r.seq, r.name, r.state) for r in session.execute(
            select(JOURNAL).where(JOURNAL.c.task_id == task_id).order_by(JOURNAL.c.seq))]


def _owner(j: Journal, task_id: str) -> tuple[str, str] | None:
    with j.sessions() as session:
        row = session.execute(select(OWNERS.c.owner, OWNERS.c.state)
                              .where(OWNERS.c.task_id == task_id)).first()
    return None if row is None else (row.owner, row.state)


def _die_inside_own_rollback(first: Journal, task_id: str) -> tuple[threading.Thread,
                                                                      list[RollbackReport]]:
    """The first delivery reserves and charges; its Redis is cut, so its lease lapses and its
    task fails; its own rollback claims `charge` and stops inside the refund."""
    _do(first, task_id, "reserve_stock", "test.redelivery_release")
    _do(first, task_id, "charge", "test.redelivery_refund")
    assert first.leases is not None
    first.leases.client.delete(lease_key(journal_lease_name(task_id)))  # lapsed, renewed by none
    reports: list[RollbackReport] = []
    thread = threading.Thread(target=lambda: reports.append(rollback(task_id, "task failed")),
                              name=FIRST, daemon=True)
    thread.start()
    assert entered.wait(10), "the first delivery's rollback never reached the refund"
    assert _rows(first, task_id) == [(1, "reserve_stock", "recorded"),
                                     (2, "charge", "compensating")]
    return thread, reports


def test_a_redelivery_undoes_what_the_first_delivery_left_before_its_first_step(
    first: Journal, second: Journal, redis_client: redis.Redis
) -> None:
    task_id = "t-redelivered"
    thread, reports = _die_inside_own_rollback(first, task_id)

    _do(second, task_id, "reserve_stock", "test.redelivery_release")  # the redelivery runs
    # Both steps of the first delivery were undone, newest first, before the new effect.
    assert undone == ["charge", "reserve_stock"]
    assert effects == ["reserve_stock", "charge", "reserve_stock"]
    assert _rows(second, task_id) == [(1, "reserve_stock", "compensated"),
                                      (2, "charge", "compensated"),
                                      (3, "reserve_stock", "recorded")]
    lease = redis_client.get(lease_key(journal_lease_name(task_id)))
    assert lease is not None and _owner(second, task_id) == (lease.decode(), "running")

    redis_client.set(GATE, "1")  # the first delivery's claimer wakes up: it is fenced
    thread.join(10)
    assert not thread.is_alive()
    [report] = reports
    assert report.handed_over and report.dead == [], report
    assert _rows(second, task_id)[:2] == [(1, "reserve_stock", "compensated"),
                                          (2, "charge", "compensated")]
    assert DeadLetters(second.sessions).list("compensation") == []
    assert _owner(second, task_id) == (lease.decode(), "running")  # not closed under us

    _do(second, task_id, "charge", "test.redelivery_refund")
    second.settle(task_id, "tests.redelivered", 0)  # the redelivery succeeds
    assert _rows(second, task_id) == [] and _owner(second, task_id) is None
    # Each effect undone at most once, and only the first delivery's.
    assert effects == ["reserve_stock", "charge", "reserve_stock", "charge"]
    assert undone == ["charge", "reserve_stock"]


def test_a_redelivery_whose_cleanup_is_fenced_out_runs_nothing(
    first: Journal, second: Journal
) -> None:
    """Between the redelivery's takeover and its first claim, another owner (a sweep, the
    rollback task) takes the journal: the redelivery must stop before its own step, leaving
    the first delivery's steps to that owner, rather than run the saga on top of them."""
    task_id = "t-redelivered-fenced"
    _do(first, task_id, "reserve_stock", "test.redelivery_release")
    first.close(task_id)  # its process is gone: lease released, owners row still running
    sweeper = Sweeper(second.sessions, FAST)

    def sweep_first(sender: object = None, **kw: Any) -> None:
        if kw.get("task_id") == task_id and (found := _owner(second, task_id)) is not None:
            owner, state = found
            assert sweeper.take_over(Candidate(task_id, owner, state)) is not None

    rollback_started.connect(sweep_first, weak=False)
    try:
        with pytest.raises(JournalLost):
            _do(second, task_id, "reserve_stock", "test.redelivery_release")
    finally:
        rollback_started.disconnect(sweep_first)
    assert effects == ["reserve_stock"]  # the redelivery ran no effect
    assert _rows(second, task_id) == [(1, "reserve_stock", "recorded")]  # the sweeper's now
    assert not second.holds(task_id)


def test_on_a_real_worker_a_redelivery_undoes_the_killed_first_delivery_first(
    platform: Platform
) -> None:
    """The same on a real prefork worker: the saga's own rollback hangs in its undo and its
    pool process is SIGTERMed there (what Celery's cancel on a connection loss sends); the
    message is redelivered at once (task_reject_on_worker_lost), with no sweeper running."""
    worker = platform.worker("redelivered")
    order = "o-redelivered"
    calls = undo_calls_key(order)
    result = platform.client.send_task("tests.support.sagas.hung_undo_saga", args=[order])
    wait_until(lambda: platform.redis.get(calls) == b"1", 30,
               "the saga's own rollback to hang in its undo")
    assert platform.states() == [("reserve_stock", "compensating")]
    [child] = pool_children(worker.pid)
    os.kill(child, signal.SIGTERM)
    # The redelivery undoes the first reservation before it reserves again; then it fails as
    # this saga always does and undoes its own.
    wait_until(lambda: platform.states() == [("reserve_stock", "compensated")] * 2, 30,
               "the redelivery to undo both reservations")
    assert platform.ledger(order) == ["reserve_stock", "release_stock",
                                      "reserve_stock", "release_stock"]
    assert result.get(timeout=10, propagate=False) is not None and result.state == "FAILURE"
    assert "delivery 2 of at most" in worker.output()
