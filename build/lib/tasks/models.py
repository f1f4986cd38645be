"""SQLAlchemy 2 models: the work table, the schedule table, and the demo table `cm_data`.

The same models run on SQLite, PostgreSQL and MariaDB; Alembic migrations in
`tasks/migrations` create them (`python -m tasks migrate`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    CursorResult,
    DateTime,
    Integer,
    Result,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "WorkItem", "Schedule", "CmData", "PartitionStatus", "utcnow", "affected",
           "WORK", "SCHEDULES", "CM_DATA", "WRITE_INTENT", "DeadLetter",
           "DEAD_LETTERS"]


def utcnow() -> datetime:
    """Naive UTC now: stored the same way on all three databases."""
    return datetime.now(UTC).replace(tzinfo=None)


# Execution option for a transaction that reads, then writes: on SQLite it begins IMMEDIATE
# (takes the write lock up front, so a later write cannot fail with SQLITE_BUSY).
WRITE_INTENT = {"write_intent": True}


def affected(result: Result[Any]) -> int:
    """Rows matched by an UPDATE or DELETE (its compare-and-set outcome)."""
    return cast(CursorResult[Any], result).rowcount


class PartitionStatus:
    """The states of a unit of work. Finished states are never dispatched again."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    EMPTY = "empty"
    FAILED = "failed"

    FINISHED = (DONE, EMPTY, FAILED)
    OPEN = (PENDING, RUNNING)


class Base(DeclarativeBase):
    pass


class WorkItem(Base):
    """One unit of long-running work: here, one id-range partition of a range job.

    `fence` is the fencing token of the lease holder that last claimed the row; every write
    made under a lease is guarded by `fence = :mine`, so a paused ex-holder can write nothing.
    `next_id` is the checkpoint: every matching row with `lo <= id < next_id` has been processed.
    """

    __tablename__ = "work_items"
    __table_args__ = (UniqueConstraint("kind", "job", "part", name="uq_work_items_job_part"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32), default="range")
    job: Mapped[str] = mapped_column(String(128))
    part: Mapped[int] = mapped_column(Integer)
    lo: Mapped[int] = mapped_column(BigInteger)
    hi: Mapped[int] = mapped_column(BigInteger)
    next_id: Mapped[int] = mapped_column(BigInteger)
    fence: Mapped[int] = mapped_column(BigInteger, default=0)
    status: Mapped[str] = mapped_column(String(16), default=PartitionStatus.PENDING)
    owner: Mapped[str | None] = mapped_column(String(255), nullable=True)
    claims: Mapped[int] = mapped_column(Integer, default=0)
    rows_done: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    dispatched_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # Rows per second of the current or last run, measured by the worker.
    rate: Mapped[float] = mapped_column(default=0.0)


class Schedule(Base):
    """A periodic round (the reconciler's, per job) guarded by a term compare-and-set.

    A round runs only after `UPDATE ... SET term = term + 1 WHERE name = :n AND term = :seen`
    matched a row and `next_run_at` has passed, so two beats never run one round twice.
    """

    __tablename__ = "schedules"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    term: Mapped[int] = mapped_column(BigInteger, default=0)
    next_run_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    active: Mapped[bool] = mapped_column(default=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class CmData(Base):
    """The demo table of seed 000: rows with `status = 0` are still to do."""

    __tablename__ = "cm_data"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    status: Mapped[int] = mapped_column(Integer, default=0, index=False)
    payload: Mapped[str] = mapped_column(String(255), default="")
    processed_count: Mapped[int] = mapped_column(Integer, default=0)
    processed_fence: Mapped[int] = mapped_column(BigInteger, default=0)


class DeadLetter(Base):
    """Something that failed for good (a poison message, a compensation that kept failing):
    kept with its reason and its JSON payload, never dropped."""

    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(64))
    ref: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


# Core tables, for compare-and-set UPDATEs and bulk reads.
WORK = cast(Table, WorkItem.__table__)
SCHEDULES = cast(Table, Schedule.__table__)
CM_DATA = cast(Table, CmData.__table__)
DEAD_LETTERS = cast(Table, DeadLetter.__table__)
