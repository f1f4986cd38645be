"""The reply codes of the restock stock scripts, the action each calls for, and the exception of
each refusal.

Every reply code maps to one :class:`Action` in :data:`ACTIONS`; :func:`raise_for` turns a
refusal code into its exception. The wrappers of :class:`~tasks.restock.scripts.StockScripts`
are the only readers of raw replies, and they read them through this module.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "ACTIONS",
    "BAD_QUANTITY",
    "DUPLICATE",
    "FAILED",
    "FULL",
    "HAS_BEEN_CONSUMED",
    "INSUFFICIENT",
    "LOCK_FAILED",
    "MAINTAINING",
    "OK",
    "PAID",
    "STALE",
    "SUCCESS",
    "UNKNOWN_SKU",
    "WRONG_TERM",
    "Action",
    "BadQuantity",
    "InsufficientStock",
    "LockNotHeld",
    "NodeMaintaining",
    "NodeStale",
    "QueueFull",
    "StockError",
    "UnexpectedReply",
    "UnknownSku",
    "raise_for",
    "reply_text",
]

OK = "OK"
UNKNOWN_SKU = "UNKNOWN_SKU"
BAD_QUANTITY = "BAD_QUANTITY"
DUPLICATE = "DUPLICATE"
INSUFFICIENT = "INSUFFICIENT"
MAINTAINING = "MAINTAINING"
STALE = "STALE"
FULL = "FULL"
SUCCESS = "SUCCESS"
LOCK_FAILED = "LOCK_FAILED"
WRONG_TERM = "WRONG_TERM"
HAS_BEEN_CONSUMED = "HAS_BEEN_CONSUMED"
PAID = "PAID"
FAILED = "FAILED"


class Action(enum.Enum):
    """What the caller does about a reply code."""

    DONE = "done"  # the call did (or had already done) its work
    REJECTED = "rejected"  # refused for good: retrying the same call cannot succeed
    RESTOCKED = "restocked"  # the entry's stock is back; entry removed
    SKIPPED = "skipped"  # entry consumed without a stock change; entry removed
    ABORT_BATCH = "abort_batch"  # shard busy or queue full: stop, try again later
    REACQUIRE = "reacquire"  # the drain lock is not ours: stop the batch, re-acquire first
    FAILED = "failed"  # this entry could not be applied, nothing changed for it: an attempt


# The one mapping from reply code to action.
ACTIONS: dict[str, Action] = {
    OK: Action.DONE,
    DUPLICATE: Action.DONE,
    UNKNOWN_SKU: Action.REJECTED,
    BAD_QUANTITY: Action.REJECTED,
    INSUFFICIENT: Action.REJECTED,
    MAINTAINING: Action.ABORT_BATCH,  # also: deduct refused; retry after the window
    STALE: Action.ABORT_BATCH,  # deduct refused until the shard's rebuild
    FULL: Action.ABORT_BATCH,
    SUCCESS: Action.RESTOCKED,
    WRONG_TERM: Action.SKIPPED,
    HAS_BEEN_CONSUMED: Action.SKIPPED,
    PAID: Action.SKIPPED,
    LOCK_FAILED: Action.REACQUIRE,
    FAILED: Action.FAILED,
}


class StockError(Exception):
    """Base of every refusal the stock scripts report."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


class UnknownSku(StockError):
    """The shard has no such SKU."""


class BadQuantity(StockError):
    """The quantity is not an integer in 1..MAX_SKU_NUM."""


class InsufficientStock(StockError):
    """Fewer units left than asked for; nothing was deducted."""


class NodeMaintaining(StockError):
    """The shard is being rebuilt; nothing was done. Try again after the window."""


class NodeStale(StockError):
    """The shard is older than the database (its term or offset counter is behind what the
    database recorded): it lost writes. Nothing was done; deductions wait for its rebuild."""


class QueueFull(StockError):
    """The delay queue is at capacity; the redo log keeps the entries (backpressure)."""


class LockNotHeld(StockError):
    """The queue's drain lock does not hold this token (lost or never held); nothing done."""


class UnexpectedReply(StockError):
    """A reply no script is documented to give."""


_ERRORS: dict[str, type[StockError]] = {
    UNKNOWN_SKU: UnknownSku,
    BAD_QUANTITY: BadQuantity,
    INSUFFICIENT: InsufficientStock,
    MAINTAINING: NodeMaintaining,
    STALE: NodeStale,
    FULL: QueueFull,
    LOCK_FAILED: LockNotHeld,
}


def reply_text(value: Any) -> str:
    """One part of a script's reply as text (Redis answers bytes unless told to decode)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def raise_for(code: str, detail: str) -> None:
    """Raise the exception of a refusal code; return for DONE/RESTOCKED/SKIPPED codes.

    An unknown code raises UnexpectedReply."""
    action = ACTIONS.get(code)
    if action is None:
        raise UnexpectedReply(code, detail)
    if action in (Action.REJECTED, Action.ABORT_BATCH, Action.REACQUIRE):
        raise _ERRORS[code](code, detail)
