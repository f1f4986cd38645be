"""The kinds of dead letter and what to do with each that cannot be replayed (the hint the CLI
and the console show when a replay is refused).

The core's own kinds are declared here; each wing declares its kinds in its `wing.py`, and
the composition root (`tasks.celery`) registers them at start, so this room names no wing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DeadLetterKind", "TASK_KIND", "OVERSIZED_KIND", "CORE_KINDS", "register", "hint",
           "kinds", "Retry", "retry_of"]

# A message that came back more often than REDELIVERY_CAP (tasks.worker.base); replayable.
TASK_KIND = "task"
# A message larger than MAX_MESSAGE_BYTES (tasks.worker.limits); only its head is kept.
OVERSIZED_KIND = "oversized-message"


# A wing's own replay of a letter of its kind: (session factory, letter id) -> what it did.
# It claims the letter itself (a compare-and-set on `replayed_at IS NULL`) and raises the
# store's DeadLetterError subclasses when it refuses.
Retry = Callable[[Any, int], str]


@dataclass(frozen=True)
class DeadLetterKind:
    """A kind of dead letter (`dead_letters.kind`) and what to do instead of a replay ('' when
    its letters keep a task to send again, or when the wing replays them itself: `retry`)."""

    name: str
    hint: str = ""
    retry: Retry | None = None


CORE_KINDS = (
    DeadLetterKind(TASK_KIND),
    DeadLetterKind(OVERSIZED_KIND,
                   "only the first bytes of the message were kept; send a smaller one"),
)

_registry: dict[str, DeadLetterKind] = {kind.name: kind for kind in CORE_KINDS}


def register(found: Iterable[DeadLetterKind]) -> None:
    """Add kinds; a name already registered with another hint is refused (two owners)."""
    for kind in found:
        known = _registry.setdefault(kind.name, kind)
        if known != kind:
            raise ValueError(f"dead-letter kind {kind.name!r} is declared twice")


def hint(kind: str) -> str:
    """What to do with a letter of `kind` instead of a replay ('' when none is known)."""
    found = _registry.get(kind)
    return found.hint if found is not None else ""


def kinds() -> dict[str, DeadLetterKind]:
    """Every registered kind by name."""
    return dict(_registry)


def retry_of(kind: str) -> Retry | None:
    """The wing's own replay of letters of `kind` (None: a replay sends the letter's task)."""
    found = _registry.get(kind)
    return found.retry if found is not None else None
