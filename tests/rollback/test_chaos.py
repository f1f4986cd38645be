"""Sagas on real prefork workers under pauses and kills (issue 9 items 1 and 12).

- SIGSTOP of the pool process past the journal lease TTL: the sweeper takes the journal over
  and compensates; after SIGCONT the task fails with JournalLost, never SUCCESS, and a step
  it then tries is refused before its effect.
- ROLLBACK_ON_RETRY=0: an attempt hands its journal over to the retry on another worker; that
  worker SIGKILLed, the sweeper rolls the whole saga back.
- A saga's own rollback hangs inside a compensation and its worker is SIGKILLed: the sweeper
  takes the journal over and runs that step's compensation again, exactly once (nem-saga-35).
- Soak: the keys and rows sagas leave return to their baseline within a bound independent of
  how many sagas ran.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from celery import group
from sqlalchemy import func, select

from tasks.deadletters.store import DeadLetters
from tasks.rollback.tables import JOURNAL, OWNERS
from tests.rollback.platform import Platform, outcome, pool_children, undone_once
from tests.support.sagas import undo_calls_key
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(120)

UNDONE = ["reserve_stock", "charge", "refund", "release_stock"]


def _pause_until_swept(platform: Platform, pid: int, order: str) -> None:
    """SIGSTOP `pid` until the sweeper has undone `order` (past the 1.5 s TTL), then SIGCONT."""
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: undone_once(platform, order), 20, "the sweeper's takeover")
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("then_ship", [False, True], ids=["returns", "one-more-step"])
def test_a_saga_paused_past_its_ttl_fails_after_the_sweeper_undid_it(
    platform: Platform, then_ship: bool
) -> None:
    worker = platform.worker("paused")
    platform.sweepers()
    order = f"o-pause-{then_ship}"
    result = platform.client.send_task("tests.support.sagas.sleepy_saga",
                                       args=[order, 4, then_ship])
    wait_until(lambda: "charge" in platform.ledger(order), 30, "the saga to charge")
    [child] = pool_children(worker.pid)
    _pause_until_swept(platform, child, order)
    wait_until(lambda: result.ready(), 30, "the paused saga to finish")
    assert outcome(result) == "FAILURE JournalLost", result.traceback
    time.sleep(1.0)  # more sweeps, and the failed owner's own rollback: still once each
    assert platform.ledger(order) == UNDONE  # with then_ship: nothing shipped
    assert platform.states() == [("reserve_stock", "compensated"), ("charge", "compensated")]
    assert platform.owners() == [(result.id, "taken_over")]
    assert platform.redis.keys("lease:{journal:*") == []


def test_a_retry_that_carries_the_journal_is_swept_when_its_worker_dies(
    platform: Platform
) -> None:
    platform.env["ROLLBACK_ON_RETRY"] = "0"
    platform.worker("first", "-Q", "first")
    second = platform.worker("second", "-Q", "second")
    platform.sweepers()
    # Handed over and carried on: the retry's success deletes the whole journal.
    fine = platform.client.send_task("tests.support.sagas.handover_saga",
                                     args=["o-fine", "second", 0], queue="first")
    assert fine.get(timeout=30) == ["reserve_stock", "charge"]
    wait_until(lambda: platform.states() == [] and platform.owners() == [], 10,
               "the journal deleted")
    # Now the retry's worker dies while the first worker lives on.
    platform.client.send_task("tests.support.sagas.handover_saga",
                              args=["o-dies", "second", 60], queue="first")
    wait_until(lambda: "charge" in platform.ledger("o-dies"), 30, "the retry to charge")
    second.kill()
    # Before the fix, the first attempt's process kept the journal lease alive for ever.
    wait_until(lambda: undone_once(platform, "o-dies"), 20, "the sweeper's rollback")
    time.sleep(1.0)
    assert platform.ledger("o-dies") == UNDONE
    assert {state for _, state in platform.states()} == {"compensated"}
    assert [state for _, state in platform.owners()] == ["taken_over"]


def test_a_step_whose_own_rollback_was_killed_mid_compensation_is_finished_once(
    platform: Platform
) -> None:
    worker = platform.worker("doomed")
    platform.sweepers()
    order = "o-hung-undo"
    calls = undo_calls_key(order)
    platform.client.send_task("tests.support.sagas.hung_undo_saga", args=[order])
    wait_until(lambda: platform.redis.get(calls) == b"1", 30,
               "the saga's own rollback to hang in its undo")
    assert platform.states() == [("reserve_stock", "compensating")]
    worker.kill()  # kill -9, mid-compensation: its journal lease lapses unrenewed
    # Before the fix the sweeper took the journal over and left the step 'compensating'.
    wait_until(lambda: platform.states() == [("reserve_stock", "compensated")], 20,
               "the sweeper to finish the step")
    time.sleep(1.0)  # more sweeps: still once
    assert platform.ledger(order) == ["reserve_stock", "release_stock"]
    assert platform.redis.get(calls) == b"2"  # the killed call and the sweeper's
    assert [state for _, state in platform.owners()] == ["taken_over"]
    assert DeadLetters(platform.sessions).list("compensation") == []


def test_keys_and_rows_return_to_baseline_whatever_the_number_of_sagas(
    platform: Platform
) -> None:
    platform.env["JOURNAL_RETENTION"] = "2"
    platform.worker("soak", concurrency=2)
    platform.sweepers()
    baseline = len(platform.rollback_keys())
    bound = 2 + 1.5 + 6.0  # retention + lease TTL + sweeps on a loaded machine
    for n in (50, 200):
        fails = [None, "charge", "ship"]
        sagas = group(platform.client.signature(
            "tasks.examples.order_saga", args=[f"soak-{n}-{i}", fails[i % 3]])
            for i in range(n))
        results = sagas.apply_async()
        results.join(timeout=90, propagate=False)
        done = time.monotonic()
        states = [r.state for r in results.results]
        assert states == [("SUCCESS" if i % 3 == 0 else "FAILURE") for i in range(n)]
        assert platform.rollback_keys()  # ledgers live on (for JOURNAL_RETENTION)

        def settled() -> bool:
            with platform.engine.connect() as conn:
                rows = conn.execute(select(func.count()).select_from(JOURNAL)).scalar()
                owners = conn.execute(select(func.count()).select_from(OWNERS)).scalar()
            return rows == owners == 0 and len(platform.rollback_keys()) == baseline

        wait_until(settled, 30, f"keys and rows back to baseline after {n} sagas")
        took = time.monotonic() - done
        print(f"{n} sagas: keys and rows back to baseline {took:.1f}s after the last one")
        assert took < bound, f"{n} sagas: back to baseline after {took:.1f}s"
