"""What beat emits, and how often: the core's dead-letter prune and every wing's entries
(`Wing.beat`), so this module names no wing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tasks.config.settings import Settings
from tasks.wing import BeatEntry, Wing, each

__all__ = ["beat_schedule", "entry", "PRUNE_INTERVAL"]

# Seconds between dead-letter prunes (DEAD_LETTER_RETENTION is days; an hour late is nothing).
PRUNE_INTERVAL = 3600.0


def entry(task: str, every: float, min_expires: float = 1.0) -> dict[str, Any]:
    """One periodic task. A periodic message that waited a whole interval is stale: the next
    one supersedes it, so it expires instead of piling up behind busy workers."""
    return {"task": task, "schedule": every, "options": {"expires": max(every, min_expires)}}


def beat_schedule(settings: Settings, wings: Iterable[Wing],
                  prune_interval: float = PRUNE_INTERVAL) -> dict[str, dict[str, Any]]:
    """The periodic tasks: every wing's entries, and the core's prune of dead letters older
    than DEAD_LETTER_RETENTION. Two entries of one name are refused (two owners)."""
    found: dict[str, dict[str, Any]] = {}
    beats: list[BeatEntry] = each(wings, "beat")
    for one in beats:
        if one.name in found:
            raise ValueError(f"beat entry {one.name!r} is declared twice")
        found[one.name] = entry(one.task, one.every(settings), one.min_expires)
    found["prune-dead-letters"] = entry("tasks.health.prune_dead_letters", prune_interval,
                                        prune_interval)
    return found
