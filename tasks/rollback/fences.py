"""What a step hands its block: its journal seq and the fence a store checks an effect against.

    with step("ship", undo="cancel_shipment", data={"order": order_id}) as s:
        ship(order_id, fence=s.fence)      # the store refuses it once the journal is lost

The sweeper takes a journal over only once its lease key is gone (`tasks.rollback.sweeper`),
and a later delivery only after writing its own token there; a lease key never comes back
with an old token (renewals extend a key that still holds the token, and never recreate it).
So an effect made in one Redis call that first checks ``GET fence.key == fence.token`` (a Lua
script, like `tasks/examples/lua/saga_step.lua`) lands before any takeover of its journal, and
the takeover's compensation sees it, or it is refused and never lands. FLUSHALL and a Redis
restart without persistence refuse it too (the key is gone): the safe direction.

An effect the platform cannot fence this way (an external API; a store on another Redis, or
in another slot of a Redis Cluster) can still land after the sweeper's compensation began:
`Journal.confirm` then finds the journal lost and runs that step's compensation once more, so
the effect is undone, but after the compensations of the steps before it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Fence", "Step"]


@dataclass(frozen=True)
class Fence:
    """The Redis key of an execution's journal lease, and the token it holds while the
    execution owns the journal."""

    key: str
    token: str


@dataclass(frozen=True)
class Step:
    """A journaled step: its seq in the journal and the fence of the execution that owns it."""

    seq: int
    fence: Fence
