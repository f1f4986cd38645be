"""What beat emits, and how often."""

from __future__ import annotations

from typing import Any

__all__ = ["beat_schedule", "PRUNE_INTERVAL"]

# Seconds between dead-letter prunes (DEAD_LETTER_RETENTION is days; an hour late is nothing).
PRUNE_INTERVAL = 3600.0


def beat_schedule(
    reconcile_interval: float, restock_interval: float = 5.0,
    prune_interval: float = PRUNE_INTERVAL,
) -> dict[str, dict[str, Any]]:
    """The periodic tasks. A periodic message that waited a whole interval is stale: the next
    one supersedes it, so it expires instead of piling up behind busy workers.

    Restock: one tick per interval, whatever the number of shards; the tick syncs every shard
    and sends a drain per shard queue with due entries and a rebuild per shard whose
    maintenance window is due (tasks.restock.dispatch). Each is idempotent and guarded by the
    shard's scripts and leases, so a duplicate message changes nothing.
    """
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
        # Deletes dead letters older than DEAD_LETTER_RETENTION.
        "prune-dead-letters": {
            "task": "tasks.health.prune_dead_letters",
            "schedule": prune_interval,
            "options": {"expires": prune_interval},
        },
        "restock-tick": {
            "task": "tasks.restock.tick",
            "schedule": restock_interval,
            "options": {"expires": max(restock_interval, 1.0)},
        },
    }
