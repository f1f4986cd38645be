"""What beat emits, and how often."""

from __future__ import annotations

from typing import Any

__all__ = ["beat_schedule"]


def beat_schedule(reconcile_interval: float) -> dict[str, dict[str, Any]]:
    """The periodic tasks. A reconcile message that waited a whole interval is stale: the next
    one supersedes it, so it expires instead of piling up behind busy workers."""
    expires = {"expires": max(reconcile_interval, 1.0)}
    return {
        "reconcile-range-jobs": {
            "task": "tasks.ranges.reconcile",
            "schedule": reconcile_interval,
            "options": expires,
        },
        # Rolls back executions whose journal lease lapsed (hard limit, SIGKILL).
        "rollback-sweep": {
            "task": "tasks.rollback.sweep",
            "schedule": reconcile_interval,
            "options": expires,
        },
    }
