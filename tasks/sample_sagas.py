"""Saga variants the rollback tests and demos run on real workers: one sleeps, one outlives
its soft limit, one hits it, one retries. Registered only with DEV_TASKS=1.

    DEV_TASKS=1 celery -A tasks worker
    celery -A tasks call tasks.sample_sagas.sleepy_saga --args '["o-1", 60]'
"""

from __future__ import annotations

import time

from celery.exceptions import SoftTimeLimitExceeded

from tasks.app import app
from tasks.base import PlatformTask
from tasks.compensations import STEPS, ledger, run_steps
from tasks.retry import RetryPolicy

__all__ = ["retrying_saga", "sleepy_saga", "slow_saga", "stubborn_saga"]


@app.task(name="tasks.sample_sagas.sleepy_saga", soft_time_limit=30, time_limit=40)
def sleepy_saga(order_id: str, seconds: float) -> None:
    """Reserve and charge, then sleep (tests kill or revoke it while it sleeps)."""
    run_steps(order_id, None, STEPS[:2])
    time.sleep(seconds)


@app.task(name="tasks.sample_sagas.stubborn_saga", soft_time_limit=1, time_limit=2)
def stubborn_saga(order_id: str) -> None:
    """Reserve and charge, then outlive the soft limit until the hard limit kills it.

    It swallows SoftTimeLimitExceeded as a careless `except Exception` would, so nothing
    but the sweeper can roll it back (a hard time limit fires no task_failure on Celery 5.6+).
    """
    run_steps(order_id, None, STEPS[:2])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            time.sleep(0.1)
        except SoftTimeLimitExceeded:
            pass


@app.task(name="tasks.sample_sagas.slow_saga", base=PlatformTask, soft_time_limit=1,
          time_limit=4)
def slow_saga(order_id: str) -> None:
    """Reserve and charge, then run into the soft limit: PlatformTask rolls both back before
    Celery records the failure."""
    run_steps(order_id, None, STEPS[:2])
    time.sleep(10)


@app.task(name="tasks.sample_sagas.retrying_saga", base=PlatformTask, bind=True,
          retry_policy=RetryPolicy(max_retries=2, initial_interval=0.2, max_interval=0.5,
                                   retry_on=(ConnectionError,)))
def retrying_saga(self: PlatformTask, order_id: str) -> list[str]:
    """Reserve, then lose the payment service on the first attempt: the failed attempt is
    rolled back before the retry, which then reserves and charges."""
    run_steps(order_id, None, STEPS[:1])
    if self.request.retries == 0:
        raise ConnectionError("payment service unreachable")
    run_steps(order_id, None, STEPS[1:2])
    return ledger(order_id)
