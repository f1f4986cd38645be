"""Every Redis key prefix and lease name of the range wing (nothing else spells them). Lease
names become keys through `lease.keys.lease_key`.

    lease range:JOB:PART          one partition of a range job is owned by one worker
    schedule range:JOB            the reconcile round of one range job (a database row name)
    range-control:{JOB}           a range job's controls for its runners: hash of `state`
                                  (paused | cancelled) and `rate` (rows/s); no TTL: copied
                                  from the job's run row by every reconcile round, deleted
                                  (its fields) by resume, start and `throttle JOB 0`
    range-throttle:{JOB}          the job's throttle (GCRA theoretical arrival time, ms); PX
                                  set to just past that time by gate.lua
    range-orphans:{JOB}           set of the job's partitions whose holder died, dispatched
                                  again by the reconciler (or handed back by the worker of
                                  a dead pool process, tasks.ranges.poolexit), for a
                                  running holder to adopt
                                  (gate.lua pops one); TTL twice the reconciler's grace; a
                                  holder's first gate call removes its own partition
    range-runners:{JOB}           sorted set of the job's outstanding runner messages (tokens
                                  scored with the server time they stop counting at;
                                  tasks.ranges.runners); PEXPIRE at its last token's end
    range-outage:{JOB}:PART       the fence of a holder that stopped for a database outage
                                  and could not hand its partition back (the row stays
                                  `running`): its next claim is no crash; TTL OUTAGE_TTL
"""

from __future__ import annotations

__all__ = [
    "RANGE_PREFIX", "range_lease_name", "range_schedule_name", "job_of_schedule",
    "RANGE_CONTROL_PREFIX", "RANGE_THROTTLE_PREFIX", "range_control_key", "range_throttle_key",
    "RANGE_ORPHANS_PREFIX", "range_orphans_key", "RANGE_OUTAGE_PREFIX", "OUTAGE_TTL",
    "range_outage_key", "RANGE_RUNNERS_PREFIX", "range_runners_key",
]

RANGE_PREFIX = "range:"
RANGE_CONTROL_PREFIX = "range-control:"
RANGE_THROTTLE_PREFIX = "range-throttle:"
RANGE_ORPHANS_PREFIX = "range-orphans:"
RANGE_OUTAGE_PREFIX = "range-outage:"
RANGE_RUNNERS_PREFIX = "range-runners:"
OUTAGE_TTL = 86400  # seconds: an outage longer than a day counts as a crash after all


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


def range_runners_key(job: str) -> str:
    """The job's outstanding runner messages (tasks.ranges.runners; same hash tag)."""
    return f"{RANGE_RUNNERS_PREFIX}{{{job}}}"
