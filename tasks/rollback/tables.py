"""The journal's two tables and the states of their rows.

On the shared `tasks.store.models.Base.metadata`, so one MetaData holds every table of the platform;
migrations 0003 and 0007 create them (and their indexes), never `create_all`.
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Integer, String, Table, Text, UniqueConstraint

from tasks.store.models import Base

__all__ = ["JOURNAL", "OWNERS", "JournalState", "OwnerState"]


class JournalState:
    """The life of a journal row. Only PENDING rows are ever claimed."""

    INTENDED = "intended"  # journaled before its effect: the effect may or may not have run
    RECORDED = "recorded"  # the step happened (or checkpoint() vouched for it)
    COMPENSATING = "compensating"  # claimed by one runner; its compensation is running
    COMPENSATED = "compensated"
    DEAD = "dead"  # the compensation kept failing: see the dead-letter store

    PENDING = (INTENDED, RECORDED)
    FINISHED = (COMPENSATED, DEAD)  # deleted JOURNAL_RETENTION after their last change


class OwnerState:
    """Who owns a journal (one `rollback_owners` row per task id)."""

    RUNNING = "running"  # the execution whose lease token is `owner` may add to it
    HANDED_OVER = "handed_over"  # between two attempts (ROLLBACK_ON_RETRY=0)
    TAKEN_OVER = "taken_over"  # the sweeper fenced the owner out and rolled it back
    ROLLED_BACK = "rolled_back"  # the owner rolled itself back (it failed)

    OPEN = (RUNNING, HANDED_OVER)
    CLOSED = (TAKEN_OVER, ROLLED_BACK)


# One row per step of an execution, `seq` counting up within its task id.
JOURNAL = Table(
    "rollback_journal", Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task_id", String(255), nullable=False),
    Column("task_name", String(255), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", String(255), nullable=False),
    Column("compensation", String(255), nullable=False),
    Column("data", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("error", Text, nullable=True),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
    UniqueConstraint("task_id", "seq", name="uq_rollback_journal_task_seq"),
)

# The fence of each journal: every write its owner makes matches `owner` and state 'running'
# in the same transaction, so a takeover (a compare-and-set on this row) fences it out.
OWNERS = Table(
    "rollback_owners", Base.metadata,
    Column("task_id", String(255), primary_key=True),
    Column("task_name", String(255), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("owner", String(64), nullable=False),  # the owner's journal lease token; '' if none
    Column("state", String(16), nullable=False),
    Column("updated_at", DateTime, nullable=False),
)
