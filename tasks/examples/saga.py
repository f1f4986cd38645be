"""An order saga with rollback checkpoints, and the compensations that undo its steps.

    celery -A tasks call tasks.examples.order_saga --args '["o-1", "ship"]'
    redis-cli lrange saga:o-1 0 -1
        reserve_stock  charge  refund  release_stock

Each step is journaled before it happens (`with step(...)`: write-ahead) and then writes to
the order's ledger (a Redis list on the platform Redis), fenced: lua/saga_step.lua appends
only while the step's journal lease holds its token, so a worker paused past the lease TTL
cannot add a step after the sweeper began to undo the saga (`tasks.rollback.fences`; on a
Redis Cluster the ledger and the lease are in different slots, and the step is appended
unfenced, as an external effect would be). The step named by `fail_at` raises
before it happens, so the task fails for good and the steps already done are undone in
reverse order. The compensations are idempotent and do nothing for a step that never ran
(lua/saga_undo.lua), as every compensation must be. The saga variants the rollback tests run
on real workers are in `tests.support.sagas` (the tests register them through EXTRA_TASK_MODULES).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from redis.commands.core import Script

from tasks.celery import app, settings
from tasks.rollback.api import step
from tasks.rollback.errors import JournalLost
from tasks.rollback.fences import Fence
from tasks.rollback.registry import compensation
from tasks.rollback.settings import rollback_settings
from tasks.store.resources import resources_for
from tasks.store.validate import InvalidArguments, quote, text_arg
from tasks.worker.base import PlatformTask

__all__ = [
    "MAX_ORDER_ID",
    "SAGA_PREFIX",
    "STEPS",
    "SagaStepFailed",
    "apply_step",
    "cancel_shipment",
    "check_order",
    "ledger",
    "place_order",
    "refund",
    "release_stock",
    "run_steps",
]

# saga:{ORDER} -> list of the step and undo names applied to one order, in order. TTL:
# JOURNAL_RETENTION, refreshed by every entry (the ledger lives as long as the journal rows
# that explain it). Owner: this module (lua/saga_step.lua and lua/saga_undo.lua).
SAGA_PREFIX = "saga:"

# The longest order id a saga accepts (it becomes part of a Redis key and of journal data).
MAX_ORDER_ID = 128

# (step, its compensation), in the order the saga runs them.
STEPS = (("reserve_stock", "release_stock"), ("charge", "refund"), ("ship", "cancel_shipment"))
_UNDONE = {undo: done for done, undo in STEPS}

_LUA = resources.files("tasks.examples") / "lua"
UNDO = (_LUA / "saga_undo.lua").read_text(encoding="utf-8")
APPLY = (_LUA / "saga_step.lua").read_text(encoding="utf-8")
_scripts: dict[str, Script] = {}  # registered once each, run on this process's client


class SagaStepFailed(Exception):
    """The step the caller asked to fail (`fail_at`) failed."""


def _key(order_id: str) -> str:
    return f"{SAGA_PREFIX}{order_id}"


def _ttl_ms() -> int:
    return max(1, round(rollback_settings(settings).journal_retention * 1000))


def ledger(order_id: str, client: Any = None) -> list[str]:
    """What happened to `order_id`, oldest first."""
    client = client if client is not None else resources_for(settings).redis
    return [entry.decode() for entry in client.lrange(_key(order_id), 0, -1)]


def _script(client: Any, text: str) -> Script:
    if text not in _scripts:
        _scripts[text] = client.register_script(text)
    return _scripts[text]


def apply_step(order_id: str, entry: str, fence: Fence, client: Any = None) -> None:
    """Append step `entry` to the order's ledger while `fence` still owns the journal, or
    raise JournalLost (nothing appended)."""
    client = client if client is not None else resources_for(settings).redis
    if settings.redis_cluster_nodes:  # another slot than the lease: unfenced (see above)
        with client.pipeline() as pipe:
            pipe.rpush(_key(order_id), entry)
            pipe.pexpire(_key(order_id), _ttl_ms())
            pipe.execute()
        return
    if _script(client, APPLY)(keys=[_key(order_id), fence.key],
                              args=[fence.token, entry, _ttl_ms()], client=client) != 1:
        raise JournalLost(f"order {order_id}: step {entry} refused, its journal was taken "
                          "over (the saga is being undone)")


def _undo(data: dict[str, Any], undo: str) -> None:
    client = resources_for(settings).redis
    _script(client, UNDO)(keys=[_key(data["order_id"])], args=[_UNDONE[undo], undo, _ttl_ms()],
                          client=client)


@compensation("release_stock")
def release_stock(data: dict[str, Any]) -> None:
    """Undo reserve_stock (idempotent; nothing if it never ran)."""
    _undo(data, "release_stock")


@compensation("refund")
def refund(data: dict[str, Any]) -> None:
    """Undo charge (idempotent; nothing if it never ran)."""
    _undo(data, "refund")


@compensation("cancel_shipment")
def cancel_shipment(data: dict[str, Any]) -> None:
    """Undo ship (idempotent; nothing if it never ran)."""
    _undo(data, "cancel_shipment")


def check_order(order_id: Any, fail_at: Any = None) -> tuple[str, str | None]:
    """The saga's arguments, or InvalidArguments (quoting at most a short prefix)."""
    order_id = text_arg("order_id", order_id, max_len=MAX_ORDER_ID)
    known = [name for name, _ in STEPS]
    if fail_at is not None and fail_at not in known:
        raise InvalidArguments(f"fail_at must be one of {known} or null, not {quote(fail_at)}")
    return order_id, fail_at


def run_steps(order_id: str, fail_at: str | None, steps: tuple[tuple[str, str], ...]) -> None:
    """Run `steps` on the order's ledger, each journaled before its effect."""
    for name, undo in steps:
        if name == fail_at:
            raise SagaStepFailed(f"order {order_id}: step {name} failed")
        with step(name, undo=undo, data={"order_id": order_id, "step": name}) as done:
            apply_step(order_id, name, done.fence)


@app.task(name="tasks.examples.order_saga", base=PlatformTask, soft_time_limit=50,
          time_limit=60)
def place_order(order_id: str, fail_at: str | None = None) -> list[str]:
    """Reserve stock, charge, ship; `fail_at` names a step that fails (for the demo)."""
    order_id, fail_at = check_order(order_id, fail_at)
    run_steps(order_id, fail_at, STEPS)
    return ledger(order_id)
