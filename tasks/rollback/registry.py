"""The compensations of this process, by name.

A compensation is registered at import (`@compensation("name")`), so every process that
imports the module defining it (the task's worker, the sweeper's) can run it by the name a
journal row carries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tasks.rollback.errors import UnknownCompensation

__all__ = ["Compensation", "compensation", "compensations", "require", "resolve"]

Compensation = Callable[[dict[str, Any]], None]
F = TypeVar("F", bound=Compensation)

_COMPENSATIONS: dict[str, Compensation] = {}


def compensation(name: str) -> Callable[[F], F]:
    """Register `fn(data) -> None` as compensation `name`.

    Registered at import, so every process that imports the module (the task's worker, the
    sweeper's) can run it by name. `fn` MUST be idempotent and must tolerate a step that never
    ran or ran in part: steps are journaled before their effect, and the owner of a step whose
    effect landed after a takeover runs its compensation a second time.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a compensation name must be a non-empty string")

    def register(fn: F) -> F:
        found = _COMPENSATIONS.get(name)
        if found is not None and found is not fn:
            qual = getattr(found, "__qualname__", found)
            raise ValueError(f"compensation {name!r} is already registered ({qual})")
        _COMPENSATIONS[name] = fn
        return fn

    return register


def compensations() -> list[str]:
    """The names of the registered compensations."""
    return sorted(_COMPENSATIONS)


def require(step: str, undo: str) -> None:
    """UnknownCompensation unless `undo` is registered: checked before step `step` is
    journaled, so no row names a compensation no process could run."""
    if undo not in _COMPENSATIONS:
        raise UnknownCompensation(
            f"checkpoint {step!r}: no compensation {undo!r} is registered "
            f"(known: {', '.join(compensations()) or 'none'})")


def resolve(undo: str) -> Compensation:
    """The compensation named `undo`, or UnknownCompensation if this process did not import
    the module that registers it."""
    fn = _COMPENSATIONS.get(undo)
    if fn is None:
        raise UnknownCompensation(f"no compensation {undo!r} here")
    return fn
