"""Every Redis key prefix and lease name of the rollback wing (nothing else spells them).

    rollback-handover:{TASK_ID}   a journal handed over to the next attempt
                                  (ROLLBACK_ON_RETRY=0); TTL the retry's countdown +
                                  VISIBILITY_TIMEOUT + LEASE_TTL
    lease journal:TASK_ID         the journal of a running task is owned by a live process
"""

from __future__ import annotations

__all__ = ["HANDOVER_PREFIX", "JOURNAL_PREFIX", "handover_key", "journal_lease_name"]

HANDOVER_PREFIX = "rollback-handover:"
JOURNAL_PREFIX = "journal:"


def handover_key(task_id: str) -> str:
    return f"{HANDOVER_PREFIX}{{{task_id}}}"


def journal_lease_name(task_id: str) -> str:
    """The lease that marks the journal of `task_id` as owned by a live process."""
    return f"{JOURNAL_PREFIX}{task_id}"
