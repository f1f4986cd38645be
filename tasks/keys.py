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
    range-control:{JOB}           a range job's controls for its runners: hash of `state`
                                  (paused | cancelled) and `rate` (rows/s); no TTL: copied
                                  from the job's run row by every reconcile round, deleted
                                  (its fields) by resume, start and `throttle JOB 0`
    range-throttle:{JOB}          the job's throttle (GCRA theoretical arrival time, ms); PX
                                  set to just past that time by gate.lua
    range-orphans:{JOB}           set of the job's partitions whose holder died, dispatched
                                  again by the reconciler, for a running holder to adopt
                                  (gate.lua pops one); TTL twice the reconciler's grace; a
                                  holder's first gate call removes its own partition
    range-outage:{JOB}:PART       the fence of a holder that stopped for a database outage
                                  and could not hand its partition back (the row stays
                                  `running`): its next claim is no crash; TTL OUTAGE_TTL
"""

from __future__ import annotations

__all__ = [
    "DELIVERIES_PREFIX", "HANDOVER_PREFIX", "RANGE_PREFIX", "BEAT_LEADER",
    "deliveries_key", "handover_key", "journal_lease_name", "range_lease_name",
    "range_schedule_name", "job_of_schedule", "RANGE_CONTROL_PREFIX", "RANGE_THROTTLE_PREFIX",
    "range_control_key", "range_throttle_key", "RANGE_ORPHANS_PREFIX", "range_orphans_key",
    "RANGE_OUTAGE_PREFIX", "OUTAGE_TTL", "range_outage_key",
]

DELIVERIES_PREFIX = "deliveries:"
HANDOVER_PREFIX = "rollback-handover:"
JOURNAL_PREFIX = "journal:"
RANGE_PREFIX = "range:"
BEAT_LEADER = "beat:leader"
RANGE_CONTROL_PREFIX = "range-control:"
RANGE_THROTTLE_PREFIX = "range-throttle:"
RANGE_ORPHANS_PREFIX = "range-orphans:"
RANGE_OUTAGE_PREFIX = "range-outage:"
OUTAGE_TTL = 86400  # seconds: an outage longer than a day counts as a crash after all


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


def range_control_key(job: str) -> str:
    """The job's control hash (hash tag: the job, shared with its throttle key)."""
    return f"{RANGE_CONTROL_PREFIX}{{{job}}}"


def range_throttle_key(job: str) -> str:
    return f"{RANGE_THROTTLE_PREFIX}{{{job}}}"


def range_orphans_key(job: str) -> str:
    """The job's partitions whose holder died, for a running holder to adopt (same tag)."""
    return f"{RANGE_ORPHANS_PREFIX}{{{job}}}"


def range_outage_key(job: str, part: int) -> str:
    """The mark of a holder of `job`'s `part` that stopped for a database outage."""
    return f"{RANGE_OUTAGE_PREFIX}{{{job}}}:{part}"
