"""A step left 'compensating' by a claimer that lost the journal (the nemesis' nem-saga-35).

The owner's lease is lost (Redis flushed), its own rollback claims step 1 and hangs inside the
compensation (its Redis black-holed); then the sweeper, or the rollback task through
`Sweeper.take_back`, takes the journal over by compare-and-set. The step must be compensated
again by the new owner, exactly once, and the old claimer, when it wakes up and its
compensation fails, must change nothing: no 'dead' row, no dead letter over the new owner's
work. Run on SQLite, PostgreSQL and MariaDB: the fence is the owners row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, update

from lease.keys import lease_key
from tasks.deadletters.store import DeadLetters
from tasks.rollback.api import rollback
from tasks.rollback.journals import Journal
from tasks.rollback.keys import journal_lease_name
from tasks.rollback.registry import compensation
from tasks.rollback.runner import STUCK_AFTER, RollbackReport
from tasks.rollback.sweeper import Sweeper, TakeBack
from tasks.rollback.tables import JOURNAL
from tasks.store.db import utcnow
from tests.rollback.conftest import FAST, process_journal
from tests.rollback.test_takeover import owner_state, rows

pytestmark = pytest.mark.timeout(60)

FIRST = "first-claimer"  # the thread of the owner's own rollback, which hangs
GATE = "stuck-claim-gate"  # set by the test: the hung claimer's Redis comes back

_redis: redis.Redis | None = None
undone: list[str] = []  # the compensations that undid something
entered = threading.Event()  # the first claimer is inside the gated compensation


@compensation("test.gated_release")
def _gated_release(data: dict[str, Any]) -> None:
    """Idempotent; in the first claimer's thread it hangs until the gate opens, then fails
    (its Redis was black-holed), as the nemesis' reserve_stock undo did."""
    if threading.current_thread().name == FIRST:
        entered.set()
        deadline = time.monotonic() + 20
        assert _redis is not None
        while not _redis.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.02)
        raise ConnectionError("the first claimer's Redis was black-holed")
    if data["step"] not in undone:
        undone.append(data["step"])


@compensation("test.interrupted_refund")
def _interrupted_refund(data: dict[str, Any]) -> None:
    """In the first claimer's thread, the process is terminated inside it: billiard's SIGTERM
    handler raises SystemExit in a pool process (Celery's cancel on a broker connection loss,
    revoke(terminate=True)), so the `finally` blocks run on the way out."""
    if threading.current_thread().name == FIRST:
        raise SystemExit(1)
    if data["step"] not in undone:
        undone.append(data["step"])


@compensation("test.plain_undo")
def _plain_undo(data: dict[str, Any]) -> None:
    if data["step"] not in undone:
        undone.append(data["step"])


@pytest.fixture
def owner(engine: Engine, redis_client: redis.Redis) -> Iterator[Journal]:
    """The owner's journal on SQLite, PostgreSQL or MariaDB, and the flushed test Redis."""
    global _redis
    _redis = redis_client
    undone.clear()
    entered.clear()
    with process_journal(engine, redis_client) as found:
        yield found
    _redis = None


def _hang_own_rollback(owner: Journal, task_id: str) -> tuple[threading.Thread,
                                                                 list[RollbackReport]]:
    """Record two steps, lose the lease, start the owner's own rollback and wait until it has
    claimed step 1 and hangs in its compensation."""
    owner.record(task_id, "tests.stuck", 0, "reserve_stock", "test.gated_release",
                 {"step": "reserve_stock"})
    owner.record(task_id, "tests.stuck", 0, "charge", "test.plain_undo", {"step": "charge"})
    assert owner.leases is not None
    owner.leases.client.delete(lease_key(journal_lease_name(task_id)))  # what FLUSHALL did
    reports: list[RollbackReport] = []
    thread = threading.Thread(target=lambda: reports.append(rollback(task_id, "task failed")),
                              name=FIRST, daemon=True)
    thread.start()
    assert entered.wait(10), "the owner's rollback never reached step 1"
    assert rows(owner, task_id) == [("reserve_stock", "compensating"),
                                    ("charge", "compensated")]
    return thread, reports


@pytest.mark.parametrize("taker", ["sweep", "take_back"])
def test_a_step_claimed_by_the_lost_owner_is_compensated_once_by_the_new_owner(
    owner: Journal, redis_client: redis.Redis, taker: str
) -> None:
    task_id = f"t-stuck-{taker}"
    thread, reports = _hang_own_rollback(owner, task_id)
    sweeper = Sweeper(owner.sessions, FAST)
    if taker == "sweep":
        assert sweeper.sweep(redis_client) == 1
    else:
        found = sweeper.take_back(redis_client, task_id, "revoked (terminated)")
        assert found.outcome == TakeBack.ROLLED_BACK and found.report is not None
        assert found.report.compensated == [1], found.report
    assert owner_state(owner, task_id) == "taken_over"
    assert rows(owner, task_id) == [("reserve_stock", "compensated"), ("charge", "compensated")]
    assert undone == ["charge", "reserve_stock"]

    redis_client.set(GATE, "1")  # the hung claimer wakes up; its compensation fails
    thread.join(10)
    assert not thread.is_alive()
    [report] = reports
    assert report.dead == [] and report.compensated == [2] and report.handed_over, report
    # Fenced: it buried nothing over the new owner's work.
    assert rows(owner, task_id) == [("reserve_stock", "compensated"), ("charge", "compensated")]
    assert DeadLetters(owner.sessions).list("compensation") == []
    assert sweeper.sweep(redis_client) == 0  # nothing left: exactly once
    assert undone == ["charge", "reserve_stock"]


def test_a_step_a_dead_sweep_left_compensating_is_taken_over_again_once_stuck(
    owner: Journal, redis_client: redis.Redis
) -> None:
    task_id = "t-stuck-sweep"
    owner.record(task_id, "tests.stuck", 0, "reserve_stock", "test.gated_release",
                 {"step": "reserve_stock"})
    owner.close(task_id)  # its process is gone: the lease released, the owners row running
    sweeper = Sweeper(owner.sessions, FAST)
    reports: list[int] = []
    # A sweep claims the step and hangs in its compensation (its worker will never finish).
    thread = threading.Thread(target=lambda: reports.append(sweeper.sweep(redis_client)),
                              name=FIRST, daemon=True)
    thread.start()
    assert entered.wait(10), "the first sweep never reached the step"
    assert sweeper.sweep(redis_client) == 0  # a live claim is left to its runner
    assert rows(owner, task_id) == [("reserve_stock", "compensating")] and undone == []

    # STUCK_AFTER later (aged here rather than waited for), the next sweep takes it over.
    with owner.sessions.begin() as session:
        session.execute(update(JOURNAL).where(JOURNAL.c.task_id == task_id).values(
            updated_at=utcnow() - timedelta(seconds=STUCK_AFTER + 1)))
    assert sweeper.sweep(redis_client) == 1
    assert rows(owner, task_id) == [("reserve_stock", "compensated")]
    assert undone == ["reserve_stock"] and owner_state(owner, task_id) == "taken_over"

    redis_client.set(GATE, "1")  # the stuck sweep wakes up: fenced, it buries nothing
    thread.join(10)
    assert not thread.is_alive() and reports == [0]
    assert rows(owner, task_id) == [("reserve_stock", "compensated")]
    assert DeadLetters(owner.sessions).list("compensation") == []
    assert sweeper.sweep(redis_client) == 0 and undone == ["reserve_stock"]


def _record_two(owner: Journal, task_id: str, newest_undo: str) -> None:
    owner.record(task_id, "tests.stuck", 0, "reserve_stock", "test.plain_undo",
                 {"step": "reserve_stock"})
    owner.record(task_id, "tests.stuck", 0, "charge", newest_undo, {"step": "charge"})


def test_an_own_rollback_terminated_in_a_compensation_leaves_the_rest_to_the_sweeper(
    owner: Journal, redis_client: redis.Redis
) -> None:
    """The nemesis' nem-saga-13 (seed 7): the owner's rollback claimed the newest step and its
    process was terminated inside the compensation. The journal must stay open (not 'rolled
    back'), its lease given up, so the next sweep takes it over and compensates the
    interrupted step and then the older one, at once."""
    task_id = "t-terminated"
    _record_two(owner, task_id, "test.interrupted_refund")
    exits: list[BaseException] = []

    def own_rollback() -> None:
        try:
            rollback(task_id, "task failed")
        except SystemExit as exc:
            exits.append(exc)

    thread = threading.Thread(target=own_rollback, name=FIRST, daemon=True)
    thread.start()
    thread.join(10)
    assert len(exits) == 1  # the termination went through
    assert rows(owner, task_id) == [("reserve_stock", "recorded"), ("charge", "compensating")]
    assert owner_state(owner, task_id) == "running"  # open: nobody rolled it back
    assert not redis_client.exists(lease_key(journal_lease_name(task_id)))
    assert Sweeper(owner.sessions, FAST).sweep(redis_client) == 1
    assert rows(owner, task_id) == [("reserve_stock", "compensated"), ("charge", "compensated")]
    assert undone == ["charge", "reserve_stock"]  # newest first
    assert owner_state(owner, task_id) == "taken_over"


def test_a_sweep_never_undoes_an_older_step_while_a_newer_one_is_being_compensated(
    owner: Journal, redis_client: redis.Redis
) -> None:
    """A closed journal (rolled back by its owner) whose newest step is still 'compensating'
    under some runner: a sweep must leave the older pending step alone until that claim is
    done or stuck, then compensate in order."""
    task_id = "t-closed-order"
    _record_two(owner, task_id, "test.plain_undo")
    owner.close(task_id, final="rolled_back")
    with owner.sessions.begin() as session:
        session.execute(update(JOURNAL).where(JOURNAL.c.task_id == task_id,
                                              JOURNAL.c.name == "charge")
                        .values(state="compensating", updated_at=utcnow()))
    sweeper = Sweeper(owner.sessions, FAST)
    assert sweeper.sweep(redis_client) == 0
    assert rows(owner, task_id) == [("reserve_stock", "recorded"), ("charge", "compensating")]
    assert undone == []
    with owner.sessions.begin() as session:  # STUCK_AFTER later (aged rather than waited for)
        session.execute(update(JOURNAL).where(JOURNAL.c.task_id == task_id).values(
            updated_at=utcnow() - timedelta(seconds=STUCK_AFTER + 1)))
    assert sweeper.sweep(redis_client) == 1
    assert rows(owner, task_id) == [("reserve_stock", "compensated"), ("charge", "compensated")]
    assert undone == ["charge", "reserve_stock"]
