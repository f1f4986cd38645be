"""The Redis keys of the core's Celery plumbing (each wing spells its own in its keys module;
the lease keys are in `lease.keys`).

    deliveries:{TASK_ID}          redeliveries of one task message (PlatformTask); TTL twice the
                                  visibility timeout
    lease beat:leader             the one beat that ticks
"""

from __future__ import annotations

__all__ = ["DELIVERIES_PREFIX", "BEAT_LEADER", "deliveries_key"]

DELIVERIES_PREFIX = "deliveries:"
BEAT_LEADER = "beat:leader"


def deliveries_key(task_id: str) -> str:
    return f"{DELIVERIES_PREFIX}{{{task_id}}}"
