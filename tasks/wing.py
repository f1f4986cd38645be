"""What a wing brings to the platform, declared once per wing (`tasks/<wing>/wing.py`).

The core never names a wing: the composition root (`tasks.wings`) lists the declarations, and
`tasks.celery` builds from them the routing rules (`tasks.worker.queues`), the beat entries
(`tasks.worker.schedule`), the metric series (`tasks.observe.metrics`), the dead-letter kinds
(`tasks.deadletters.kinds`), the settings sections (`tasks.config.settings`) and the task
modules Celery imports. A wing's tables register themselves on the shared MetaData when its
`tables` module is imported (`tasks.wings.table_modules`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tasks.deadletters.kinds import DeadLetterKind

if TYPE_CHECKING:
    from tasks.config.settings import Settings

__all__ = ["Route", "BeatEntry", "Wing", "DeadLetterKind"]


@dataclass(frozen=True)
class Route:
    """Tasks named `pattern` (a name or a glob) run on the queue `queue(settings)` names."""

    pattern: str
    queue: Callable[[Settings], str]


@dataclass(frozen=True)
class BeatEntry:
    """A periodic task beat emits every `every(settings)` seconds. A message that waited a
    whole interval is stale (the next one supersedes it), so it expires after the interval
    (at least `min_expires` seconds)."""

    name: str
    task: str
    every: Callable[[Settings], float]
    min_expires: float = 1.0


@dataclass(frozen=True)
class Wing:
    """One wing's declaration.

    `task_modules`: what Celery imports (its `include`); `tables`: the module declaring its
    tables on `tasks.store.models.Base.metadata`; `settings`: its settings section class
    (`tasks.config.settings.Section`); `series`: its metric series class, built by
    `tasks.observe.metrics.Metrics` (`series(make)`, with `zero(settings)`); `state`: reads
    its shared state at scrape time (`(settings) -> Iterable[Metric]`), named `module:function`
    so a scrape source that cannot be imported is skipped, not fatal.
    """

    name: str
    task_modules: tuple[str, ...] = ()
    tables: str | None = None
    settings: type[Any] | None = None
    routes: tuple[Route, ...] = ()
    beat: tuple[BeatEntry, ...] = ()
    series: type[Any] | None = None
    state: str | None = None
    dead_letter_kinds: tuple[DeadLetterKind, ...] = ()


def each(wings: Iterable[Wing], attribute: str) -> list[Any]:
    """Every wing's `attribute` items (a tuple field), in wing order."""
    return [item for wing in wings for item in getattr(wing, attribute)]
