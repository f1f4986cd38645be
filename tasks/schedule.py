"""What beat emits, and how often."""

from __future__ import annotations

from typing import Any

__all__ = ["beat_schedule", "PRUNE_INTERVAL"]

# Seconds between dead-letter prunes (DEAD_LETTER_RETENTION is days; an hour late is nothing).
PRUNE_INTERVAL = 3600.0


def beat_schedule(
    reconcile_interval: float, restock_nodes: int = 1, queues: tuple[str, ...] = ("q0", "q1"),
    restock_interval: float = 5.0, prune_interval: float = PRUNE_INTERVAL,
) -> dict[str, dict[str, Any]]:
    """The periodic tasks. A periodic message that waited a whole interval is stale: the next
    one supersedes it, so it expires instead of piling up behind busy workers.

    Restock: a sync and a drain per queue of every node, and a rebuild per node (it returns at
    once unless the node's maintenance window is due). Each is idempotent and guarded by the
    node's scripts and leases, so a duplicate message changes nothing.
    """
    expires = {"expires": max(reconcile_interval, 1.0)}
    restock_expires = {"expires": max(restock_interval, 1.0)}
    schedule: dict[str, dict[str, Any]] = {
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
    }
    for node in range(restock_nodes):
        for queue in queues:
            for job in ("sync", "drain"):
                schedule[f"restock-{job}-{node}-{queue}"] = {
                    "task": f"tasks.restock.{job}",
                    "schedule": restock_interval,
                    "args": (node, queue),
                    "options": restock_expires,
                }
        schedule[f"restock-rebuild-{node}"] = {
            "task": "tasks.restock.rebuild",
            "schedule": restock_interval,
            "args": (node,),
            "options": restock_expires,
        }
    return schedule
