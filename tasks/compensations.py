"""An order saga with rollback checkpoints, and the compensations that undo its steps.

    celery -A tasks call tasks.compensations.place_order --args '["o-1", "ship"]'
    redis-cli lrange saga:o-1 0 -1
        reserve_stock  charge  refund  release_stock

Each step writes to the order's ledger (a Redis list on the platform Redis) and then records a
checkpoint naming its undo; the step named by `fail_at` raises before it happens, so the task
fails for good and the steps already done are undone in reverse order. The saga variants the
rollback tests run on real workers are in `tasks.sample_sagas` (registered with DEV_TASKS=1).
"""

from __future__ import annotations

from typing import Any

from tasks.app import app, settings
from tasks.base import PlatformTask
from tasks.resources import resources_for
from tasks.rollback import checkpoint, compensation

__all__ = [
    "SAGA_PREFIX",
    "STEPS",
    "SagaStepFailed",
    "cancel_shipment",
    "ledger",
    "place_order",
    "refund",
    "release_stock",
    "run_steps",
]

# saga:{ORDER} -> list of the step and undo names applied to one order, in order. No TTL: it is
# the example's observable effect, deleted by whoever inspects it. Owner: this module.
SAGA_PREFIX = "saga:"

# (step, its compensation), in the order the saga runs them.
STEPS = (("reserve_stock", "release_stock"), ("charge", "refund"), ("ship", "cancel_shipment"))


class SagaStepFailed(Exception):
    """The step the caller asked to fail (`fail_at`) failed."""


def _key(order_id: str) -> str:
    return f"{SAGA_PREFIX}{order_id}"


def ledger(order_id: str, client: Any = None) -> list[str]:
    """What happened to `order_id`, oldest first."""
    client = client if client is not None else resources_for(settings).redis
    return [entry.decode() for entry in client.lrange(_key(order_id), 0, -1)]


def _append(order_id: str, entry: str) -> None:
    resources_for(settings).redis.rpush(_key(order_id), entry)


@compensation("release_stock")
def release_stock(data: dict[str, Any]) -> None:
    """Undo reserve_stock."""
    _append(data["order_id"], "release_stock")


@compensation("refund")
def refund(data: dict[str, Any]) -> None:
    """Undo charge."""
    _append(data["order_id"], "refund")


@compensation("cancel_shipment")
def cancel_shipment(data: dict[str, Any]) -> None:
    """Undo ship."""
    _append(data["order_id"], "cancel_shipment")


def run_steps(order_id: str, fail_at: str | None, steps: tuple[tuple[str, str], ...]) -> None:
    known = {step for step, _ in STEPS}
    if fail_at is not None and fail_at not in known:
        raise ValueError(f"fail_at must be one of {sorted(known)} or null, not {fail_at!r}")
    for step, undo in steps:
        if step == fail_at:
            raise SagaStepFailed(f"order {order_id}: step {step} failed")
        _append(order_id, step)
        checkpoint(step, undo=undo, data={"order_id": order_id, "step": step})


@app.task(name="tasks.compensations.place_order", base=PlatformTask, soft_time_limit=50,
          time_limit=60)
def place_order(order_id: str, fail_at: str | None = None) -> list[str]:
    """Reserve stock, charge, ship; `fail_at` names a step that fails (for the demo)."""
    if not isinstance(order_id, str) or not order_id:
        raise ValueError("order_id must be a non-empty string")
    run_steps(order_id, fail_at, STEPS)
    return ledger(order_id)
