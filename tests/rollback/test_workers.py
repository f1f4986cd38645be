"""Rollback on real prefork workers: failure, hard time limit, SIGKILL, revoke(terminate).

A background thread sends `tasks.rollback.sweep` every 0.3 s, as beat would, to a sweeper
worker of concurrency 2 on its own queue, so two sweeps often run at once: still, nothing is
undone twice.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.rollback.platform import Platform, pool_children, undone_once
from tests.support.workers import celery_call, wait_until

pytestmark = pytest.mark.timeout(90)


def test_a_task_that_fails_for_good_is_rolled_back(platform: Platform) -> None:
    platform.worker("fails")
    sent = celery_call(platform.env, "tasks.examples.order_saga",
                       "--args", '["o-1", "ship"]')
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: len(platform.ledger("o-1")) == 4, 30, "the saga to be undone")
    assert platform.ledger("o-1") == ["reserve_stock", "charge", "refund", "release_stock"]
    assert platform.states() == [("reserve_stock", "compensated"), ("charge", "compensated")]


def test_the_sweeper_rolls_back_a_task_killed_by_its_hard_time_limit(
    platform: Platform
) -> None:
    worker = platform.worker("hard")
    platform.sweepers()
    platform.client.send_task("tests.support.sagas.stubborn_saga", args=["o-2"])
    wait_until(lambda: "Hard time limit" in worker.output(), 30, "the hard time limit")
    wait_until(lambda: undone_once(platform, "o-2"), 15, "the sweeper's rollback")
    time.sleep(1.0)  # more sweeps: still once
    assert platform.ledger("o-2") == ["reserve_stock", "charge", "refund", "release_stock"]
    assert {state for _, state in platform.states()} == {"compensated"}


def test_the_sweeper_rolls_back_after_sigkill_of_the_pool_process(platform: Platform) -> None:
    worker = platform.worker("killed")
    platform.sweepers()
    platform.client.send_task("tests.support.sagas.sleepy_saga", args=["o-3", 60])
    wait_until(lambda: "charge" in platform.ledger("o-3"), 30, "the saga to charge")
    children = pool_children(worker.pid)
    assert len(children) == 1
    os.kill(children[0], signal.SIGKILL)
    # The message is redelivered (task_reject_on_worker_lost); whichever of the sweeper and the
    # redelivered run gets there first undoes the dead run, and only once.
    wait_until(lambda: undone_once(platform, "o-3"), 20, "the rollback of the killed run")
    time.sleep(1.0)
    entries = platform.ledger("o-3")
    # The redelivered run may do its first step before its first checkpoint recovers the dead
    # run, so only the undos' own order is fixed.
    assert entries[:2] == ["reserve_stock", "charge"]
    assert [e for e in entries if e in ("refund", "release_stock")] == ["refund", "release_stock"]


def test_revoke_with_terminate_rolls_back(platform: Platform) -> None:
    platform.worker("revoked")
    result = platform.client.send_task("tests.support.sagas.sleepy_saga", args=["o-4", 60])
    wait_until(lambda: "charge" in platform.ledger("o-4"), 30, "the saga to charge")
    platform.client.control.revoke(result.id, terminate=True, signal="SIGKILL")
    wait_until(lambda: undone_once(platform, "o-4"), 20, "the rollback of the revoked run")
    time.sleep(0.5)
    assert platform.ledger("o-4") == ["reserve_stock", "charge", "refund", "release_stock"]


def test_the_soft_limit_rolls_back_before_the_failure_is_recorded(platform: Platform) -> None:
    platform.worker("soft")
    result = platform.client.send_task("tests.support.sagas.slow_saga", ["o-soft"])
    wait_until(lambda: result.state == "FAILURE", 30, "the soft time limit")
    # Read right after the failure became visible: the undo already happened, newest first.
    assert platform.ledger("o-soft") == ["reserve_stock", "charge", "refund", "release_stock"]
    assert not platform.redis.keys("lease:{journal:*")  # its journal lease was released
    assert "SoftTimeLimitExceeded" in str(result.traceback)
    assert [state for _, state in platform.states()] in ([], ["compensated", "compensated"])


def test_the_sweeper_rolls_back_after_sigkill_of_the_whole_worker(platform: Platform) -> None:
    worker = platform.worker("doomed")
    platform.sweepers()
    platform.client.send_task("tests.support.sagas.sleepy_saga", args=["o-5", 60])
    wait_until(lambda: "charge" in platform.ledger("o-5"), 30, "the saga to charge")
    worker.kill()  # SIGKILL of the main process and its pool: no handler runs anywhere
    # The message waits for the visibility timeout (an hour); the sweeper does not.
    wait_until(lambda: undone_once(platform, "o-5"), 20, "the sweeper's rollback")
    time.sleep(1.0)
    assert platform.ledger("o-5") == ["reserve_stock", "charge", "refund", "release_stock"]
    assert {state for _, state in platform.states()} == {"compensated"}


def test_a_retry_first_rolls_back_the_failed_attempt(platform: Platform) -> None:
    platform.worker("retry")
    result = platform.client.send_task("tests.support.sagas.retrying_saga", ["o-6"])
    assert result.get(timeout=30) == ["reserve_stock", "release_stock", "reserve_stock", "charge"]
    wait_until(lambda: platform.states() == [], 10, "the successful run's journal discarded")
