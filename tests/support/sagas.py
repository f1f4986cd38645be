"""Saga variants the rollback tests and demos run on real workers: one sleeps (and may take one
more step after it), one waits at a gate the test opens, one outlives its soft limit, one hits
it, one retries, one hands its journal over to a retry on another queue, one whose own
rollback hangs in its first undo until the test kills its worker. Registered when
EXTRA_TASK_MODULES names this module (the tests do).

    EXTRA_TASK_MODULES=tests.support.sagas celery -A tasks worker
    celery -A tasks call tests.support.sagas.sleepy_saga --args '["o-1", 60]'
"""

from __future__ import annotations

import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from tasks.celery import app, settings
from tasks.examples.saga import (
    SAGA_PREFIX,
    STEPS,
    SagaStepFailed,
    check_order,
    ledger,
    refund,
    release_stock,
    run_steps,
)
from tasks.rollback.api import step
from tasks.rollback.registry import compensation
from tasks.store.resources import resources_for
from tasks.store.validate import InvalidArguments, text_arg
from tasks.worker.base import PlatformTask
from tasks.worker.retry import RetryPolicy

__all__ = ["GATE_PREFIX", "UNDO_CALLS_PREFIX", "GateClosed", "gate_key", "gated_refund",
           "gated_release_stock", "gated_saga", "handover_saga", "hung_refund_saga",
           "hung_undo_saga", "retrying_saga", "sleepy_saga", "slow_saga", "stubborn_saga",
           "undo_calls_key"]

# saga-gate:{ORDER} -> "1" once the test lets a gated saga ship. Owner: the tests that set it,
# with a TTL of their choosing.
GATE_PREFIX = "saga-gate:"
# saga-undo-calls:{ORDER} -> how many times gated_release_stock ran for the order. Owner: that
# compensation; TTL UNDO_CALLS_TTL_MS from its last call.
UNDO_CALLS_PREFIX = "saga-undo-calls:"
UNDO_CALLS_TTL_MS = 120_000


class GateClosed(Exception):
    """A gated saga's gate stayed closed for as long as it was told to wait."""


def gate_key(order_id: str) -> str:
    return f"{GATE_PREFIX}{{{order_id}}}"


def undo_calls_key(order_id: str) -> str:
    return f"{UNDO_CALLS_PREFIX}{{{order_id}}}"


def _wait_at_gate(client: Any, order_id: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not client.exists(gate_key(order_id)):
        if time.monotonic() > deadline:
            raise GateClosed(f"order {order_id}: the gate stayed closed for {seconds:g}s")
        time.sleep(0.05)


def _seconds(value: object, most: float = 120.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise InvalidArguments(f"seconds must be a number in 0..{most:g}")
    return float(value)


@app.task(name="tests.support.sagas.sleepy_saga", base=PlatformTask, soft_time_limit=30,
          time_limit=40)
def sleepy_saga(order_id: str, seconds: float, then_ship: bool = False) -> list[str]:
    """Reserve and charge, then sleep (tests kill, revoke or pause it while it sleeps); with
    `then_ship`, ship after the sleep."""
    order_id, _ = check_order(order_id)
    seconds = _seconds(seconds)
    run_steps(order_id, None, STEPS[:2])
    time.sleep(seconds)
    if then_ship:
        run_steps(order_id, None, STEPS[2:])
    return ledger(order_id)


@app.task(name="tests.support.sagas.gated_saga", base=PlatformTask, soft_time_limit=100,
          time_limit=110)
def gated_saga(order_id: str, seconds: float) -> list[str]:
    """Reserve and charge, then wait until the order's gate opens (at most `seconds`, then
    GateClosed), then ship: a test holds the saga alive for exactly as long as it needs."""
    order_id, _ = check_order(order_id)
    seconds = _seconds(seconds)
    run_steps(order_id, None, STEPS[:2])
    _wait_at_gate(resources_for(settings).redis, order_id, seconds)
    run_steps(order_id, None, STEPS[2:])
    return ledger(order_id)


@app.task(name="tests.support.sagas.stubborn_saga", base=PlatformTask, soft_time_limit=1,
          time_limit=2)
def stubborn_saga(order_id: str) -> None:
    """Reserve and charge, then outlive the soft limit until the hard limit kills it.

    It swallows SoftTimeLimitExceeded as a careless `except Exception` would, so nothing
    but the sweeper can roll it back (a hard time limit fires no task_failure on Celery 5.6+).
    """
    order_id, _ = check_order(order_id)
    run_steps(order_id, None, STEPS[:2])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            time.sleep(0.1)
        except SoftTimeLimitExceeded:
            pass


@app.task(name="tests.support.sagas.slow_saga", base=PlatformTask, soft_time_limit=1,
          time_limit=4)
def slow_saga(order_id: str) -> None:
    """Reserve and charge, then run into the soft limit: PlatformTask rolls both back before
    Celery records the failure."""
    order_id, _ = check_order(order_id)
    run_steps(order_id, None, STEPS[:2])
    time.sleep(10)


@app.task(name="tests.support.sagas.retrying_saga", base=PlatformTask, bind=True,
          retry_policy=RetryPolicy(max_retries=2, initial_interval=0.2, max_interval=0.5,
                                   retry_on=(ConnectionError,)))
def retrying_saga(self: PlatformTask, order_id: str) -> list[str]:
    """Reserve, then lose the payment service on the first attempt: the failed attempt is
    rolled back before the retry, which then reserves and charges."""
    order_id, _ = check_order(order_id)
    run_steps(order_id, None, STEPS[:1])
    if self.request.retries == 0:
        raise ConnectionError("payment service unreachable")
    run_steps(order_id, None, STEPS[1:2])
    return ledger(order_id)


@app.task(name="tests.support.sagas.handover_saga", base=PlatformTask, bind=True,
          soft_time_limit=30, time_limit=40)
def handover_saga(self: PlatformTask, order_id: str, retry_queue: str,
                  seconds: float) -> list[str]:
    """Reserve, then retry on `retry_queue` (another worker); the retry charges and sleeps.

    With ROLLBACK_ON_RETRY=0 the first attempt hands its journal over to the retry, so the
    reservation is carried on (and undone by the sweeper if the retry's worker dies)."""
    order_id, _ = check_order(order_id)
    retry_queue = text_arg("retry_queue", retry_queue, max_len=64)
    seconds = _seconds(seconds)
    if self.request.retries == 0:
        run_steps(order_id, None, STEPS[:1])
        raise self.retry(queue=retry_queue, countdown=0.2, max_retries=1)
    run_steps(order_id, None, STEPS[1:2])
    time.sleep(seconds)
    return ledger(order_id)


def _first_call_waits(data: dict[str, Any]) -> None:
    """Count the calls of a gated undo for the order; the first waits at the order's gate
    (at most 60 s, then GateClosed): a test kills or terminates the process that made it."""
    client = resources_for(settings).redis
    key = undo_calls_key(data["order_id"])
    with client.pipeline() as pipe:
        pipe.incr(key)
        pipe.pexpire(key, UNDO_CALLS_TTL_MS)
        calls, _ = pipe.execute()
    if calls == 1:
        _wait_at_gate(client, data["order_id"], 60)


@compensation("tests.gated_release_stock")
def gated_release_stock(data: dict[str, Any]) -> None:
    """release_stock (idempotent), but its first call for an order waits at the gate."""
    _first_call_waits(data)
    release_stock(data)


@compensation("tests.gated_refund")
def gated_refund(data: dict[str, Any]) -> None:
    """refund (idempotent), but its first call for an order waits at the gate."""
    _first_call_waits(data)
    refund(data)


@app.task(name="tests.support.sagas.hung_undo_saga", base=PlatformTask, soft_time_limit=100,
          time_limit=110)
def hung_undo_saga(order_id: str) -> None:
    """Reserve stock (undone by tests.gated_release_stock), then fail: the saga's own rollback
    claims the step and hangs in its undo until the test kills the worker."""
    order_id, _ = check_order(order_id)
    data = {"order_id": order_id, "step": "reserve_stock"}
    with step("reserve_stock", undo="tests.gated_release_stock", data=data):
        client = resources_for(settings).redis
        with client.pipeline() as pipe:
            pipe.rpush(f"{SAGA_PREFIX}{order_id}", "reserve_stock")
            pipe.pexpire(f"{SAGA_PREFIX}{order_id}", UNDO_CALLS_TTL_MS)
            pipe.execute()
    raise SagaStepFailed(f"order {order_id}: charge failed")


@app.task(name="tests.support.sagas.hung_refund_saga", base=PlatformTask, soft_time_limit=100,
          time_limit=110)
def hung_refund_saga(order_id: str) -> None:
    """Reserve stock, charge (undone by tests.gated_refund), then fail: the saga's own
    rollback claims the charge and hangs in its refund, the reservation still to undo, until
    the test terminates its pool process."""
    order_id, _ = check_order(order_id)
    run_steps(order_id, None, STEPS[:1])
    data = {"order_id": order_id, "step": "charge"}
    with step("charge", undo="tests.gated_refund", data=data):
        client = resources_for(settings).redis
        with client.pipeline() as pipe:
            pipe.rpush(f"{SAGA_PREFIX}{order_id}", "charge")
            pipe.pexpire(f"{SAGA_PREFIX}{order_id}", UNDO_CALLS_TTL_MS)
            pipe.execute()
    raise SagaStepFailed(f"order {order_id}: ship failed")
