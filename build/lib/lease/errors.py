"""Lease exceptions, and the one place where script return codes become them."""

from __future__ import annotations

from typing import Literal, NoReturn

__all__ = ["LeaseError", "LeaseLost", "NotAcquired", "NotHeld", "Operation", "raise_refused"]


class LeaseError(Exception):
    """Base class of every lease failure; `name` is the lease's name."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"lease {name!r}: {reason}")
        self.name = name
        self.reason = reason


class NotAcquired(LeaseError):
    """Someone else holds the lease (and a blocking acquire's timeout ran out)."""


class LeaseLost(LeaseError):
    """You held the lease and lost it: renewal refused, token mismatch, or safe-until passed.

    Anything done under the lease after this may overlap another holder: stop, and let the
    fence reject any write still in flight.
    """


class NotHeld(LeaseError):
    """You never held the lease here: it was already released, or acquired by another process
    (a forked child inherits no leases)."""


Operation = Literal["acquire", "renew", "release"]

# What a refusal by each script means for the caller.
_REFUSALS: dict[Operation, tuple[type[LeaseError], str]] = {
    "acquire": (NotAcquired, "held by another holder"),
    "renew": (LeaseLost, "renewal refused: the token no longer matches"),
    "release": (LeaseLost, "release refused: the token no longer matches"),
}


def raise_refused(operation: Operation, name: str, detail: str = "") -> NoReturn:
    """Raise the exception for a script that refused `operation` on lease `name`."""
    cls, reason = _REFUSALS[operation]
    raise cls(name, f"{reason}{detail}")
