"""Every Redis key prefix and lease name of the platform core and its range and rollback wings.

The restock wing's keys are in `tasks.restock.keys`, the lease keys in `lease.keys`; nothing
else spells a prefix. Lease names below become keys through `lease.keys.lease_key`.

    deliveries:{TASK_ID}          redeliveries of one task message (PlatformTask); TTL twice the
                                  visibility timeout
    rollback-handover:{TASK_ID}   a journal handed over to the next attempt
                                  (ROLLBACK_ON_RETRY=0); TTL the retry's countdown +
                                  VISIBILITY_TIMEOUT + LEASE_TTL
    lease journal:TASK_ID         the journal of a running task is owned by a live process
    lease range:JOB:PART          one partition of a range job is owned by one worker
    schedule range:JOB            the reconcile round of one range job (a database row name)
    lease beat:leader             the one beat that ticks
"""

from __future__ import annotations

__all__ = [
    "DELIVERIES_PREFIX", "HANDOVER_PREFIX", "RANGE_PREFIX", "BEAT_LEADER",
    "deliveries_key", "handover_key", "journal_lease_name", "range_lease_name",
    "range_schedule_name", "job_of_schedule",
]

DELIVERIES_PREFIX = "deliveries:"
HANDOVER_PREFIX = "rollback-handover:"
JOURNAL_PREFIX = "journal:"
RANGE_PREFIX = "range:"
BEAT_LEADER = "beat:leader"


def deliveries_key(task_id: str) -> str:
    return f"{DELIVERIES_PREFIX}{{{task_id}}}"


def handover_key(task_id: str) -> str:
    return f"{HANDOVER_PREFIX}{{{task_id}}}"


def journal_lease_name(task_id: str) -> str:
    """The lease that marks the journal of `task_id` as owned by a live process."""
    return f"{JOURNAL_PREFIX}{task_id}"


def range_lease_name(job: str, part: int) -> str:
    return f"{RANGE_PREFIX}{job}:{part}"


def range_schedule_name(job: str) -> str:
    return f"{RANGE_PREFIX}{job}"


def job_of_schedule(name: str) -> str:
    return name.removeprefix(RANGE_PREFIX)
