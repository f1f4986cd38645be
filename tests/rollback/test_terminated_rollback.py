"""A saga's own rollback terminated inside a compensation, its message never run again (the
nemesis' nem-saga-13, seed 7): on a real prefork worker, with real sweeps.

The saga reserved and charged, then failed; its own rollback claimed the charge and hangs in
the refund. Its pool process is SIGTERMed there (what Celery's cancel on a broker connection
loss, and revoke(terminate=True), send; billiard raises SystemExit, so `finally` blocks run).
The message's redelivery finds it expired (as a broker restart that lost it would leave it:
nothing runs it again), so only the sweeper can finish the rollback. It must, at once and
newest first: refund, then release the reservation.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.rollback.platform import Platform, pool_children
from tests.support.sagas import undo_calls_key
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(120)

EXPIRES_S = 10.0  # the saga's message expires this long after it is sent


def test_a_rollback_terminated_in_a_compensation_is_finished_by_the_sweeper_in_order(
    platform: Platform
) -> None:
    worker = platform.worker("terminated")
    platform.sweepers()
    order = "o-terminated"
    sent = time.monotonic()
    platform.client.send_task("tests.support.sagas.hung_refund_saga", args=[order],
                              expires=EXPIRES_S)
    wait_until(lambda: platform.redis.get(undo_calls_key(order)) == b"1", EXPIRES_S,
               "the saga's own rollback to hang in its refund")
    assert platform.states() == [("reserve_stock", "recorded"), ("charge", "compensating")]
    time.sleep(max(0.0, sent + EXPIRES_S + 0.5 - time.monotonic()))  # its redelivery is void
    [child] = pool_children(worker.pid)
    os.kill(child, signal.SIGTERM)
    # Well within STUCK_AFTER (120 s): the sweeper takes the journal over and adopts the
    # interrupted refund, then releases the reservation.
    wait_until(lambda: platform.states() == [("reserve_stock", "compensated"),
                                             ("charge", "compensated")], 30,
               "the sweeper to finish the rollback")
    assert platform.ledger(order) == ["reserve_stock", "charge", "refund", "release_stock"]
    assert [state for _, state in platform.owners()] == ["taken_over"]
    # The test's premise: the redelivery is discarded, not run (the ledger above holds one
    # reservation), so the sweeper alone finished the rollback.
    wait_until(lambda: "Discarding revoked task: tests.support.sagas.hung_refund_saga"
               in worker.output(), 20, "the expired redelivery to be discarded")
    assert platform.ledger(order) == ["reserve_stock", "charge", "refund", "release_stock"]
