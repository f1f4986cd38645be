"""The range wing's tables, on the shared `tasks.store.models.Base.metadata`:

    work_items, schedules           range jobs (partitions and their reconcile rounds)
    range_runs, range_run_events    range jobs' runs and who asked for each control
    range_job_schedules             range jobs' cron schedules (tasks.ranges.timetable)
    range_run_input                 a collection job's run input (the lines of its CSV)

Migrations 0001, 0005, 0011, 0012, 0013, 0015, 0016, 0017 and 0018 create them, never
`create_all`.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import BigInteger, DateTime, Index, Integer, String, Table, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from tasks.store.db import utcnow
from tasks.store.models import Base

__all__ = ["PartitionStatus", "WorkItem", "Schedule", "RunState", "RangeRun", "RangeRunEvent",
           "JobSchedule", "RangeRunInput", "WORK", "SCHEDULES", "RANGE_RUNS",
           "RANGE_RUN_EVENTS", "JOB_SCHEDULES", "RUN_INPUT"]


class PartitionStatus:
    """The states of a unit of work. Finished states are never dispatched again."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    EMPTY = "empty"
    FAILED = "failed"
    # Stopped by `tasks.ranges.pause` or `cancel` at a batch boundary; never dispatched while
    # so (resume sets it back to pending). Neither open nor finished.
    PAUSED = "paused"

    FINISHED = (DONE, EMPTY, FAILED)
    OPEN = (PENDING, RUNNING)


class WorkItem(Base):
    """One unit of long-running work: here, one id-range partition of a range job.

    `fence` is the fencing token of the lease holder that last claimed the row; every write
    made under a lease is guarded by `fence = :mine`, so a paused ex-holder can write nothing.
    `lo`/`hi` are fixed when the partition is planned and never recomputed. `next_id` is the
    keyset cursor of the current pass; a partition is done only after a closing read of
    `lo..hi` with the job's filter found nothing (README: which rows a run processes).
    `crashes` counts consecutive claims that ended without the holder releasing the row or
    committing a batch; `settled_at` is no longer written (the closing round replaced the
    per-partition late-commit check; the column stays for old rows).
    """

    __tablename__ = "work_items"
    # The index on status answers "is any partition of the job still open?" without reading
    # every finished one (a holder asks it as it finishes), and in partition order it gives
    # the claim its next pending partition without sorting them all (migrations 0012, 0014).
    __table_args__ = (UniqueConstraint("kind", "job", "part", name="uq_work_items_job_part"),
                      Index("ix_work_items_job_status_part", "kind", "job", "status", "part"))

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
    crashes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    settled_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # Set while the holder waits for the job's throttle (rows/s cap or `throttle_on`) before
    # its next batch; cleared by the next checkpoint (migration 0011).
    throttled_until: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # Rows of the current run its skip policy quarantined and no retry took back, counted in
    # the batch's transaction like `rows_done` (migration 0015).
    rows_skipped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # A custom collection's place (tasks.ranges.collections): the cursor after the last page
    # committed, JSON text; None: from the start (migration 0018).
    collection_cursor: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A keyed job's partition (tasks.ranges.jobkeys): its keys `lo_key < key <= hi_key`
    # (None: unbounded) and the cursor of its keyset pass (the last key read; None: from
    # `lo_key`), JSON text; `lo`, `hi` and `next_id` are then row ordinals, for progress
    # (migration 0017). None for an integer key.
    lo_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    hi_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    next_key: Mapped[str | None] = mapped_column(Text, nullable=True)


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
    # When the job's last closing read began (tasks.ranges.closing; migration 0012).
    closed_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # The highest fence of partitions a re-plan deleted (a start after cancel): new ones are
    # planned with it, so a holder of the old plan is fenced out even if Redis lost its
    # fence counters (migration 0012).
    fence_floor: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class RunState:
    """The states of a range job's run. Running, paused and following runs are live; the
    others ended. `following`: a `follow` job's run that caught up; it goes on processing rows
    that come to match until it is cancelled (tasks.ranges.closing)."""

    RUNNING = "running"
    PAUSED = "paused"
    FOLLOWING = "following"
    CANCELLED = "cancelled"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    LIVE = (RUNNING, PAUSED, FOLLOWING)
    ENDED = (CANCELLED, SUCCEEDED, FAILED)


class RangeRun(Base):
    """One run of a range job, from `tasks.ranges.start` until every partition finished
    (succeeded, or failed if one failed) or it was cancelled (`tasks.ranges.runs`).

    `rows_base` is the job's `work_items.rows_done` total when the run opened, so `rows` (set
    when the run ends) counts this run's rows only (since migration 0015 a new run's
    partitions start from zero, so it is 0). `rows_per_s` is the throttle in force
    (None: none); the source of truth the reconciler copies to Redis each round. `number`
    counts the job's runs (1, 2, 3...; unique per job, given as the run opens), `started_by`
    is who opened it, and `skipped` (set when the run ends) its rows still quarantined.
    """

    __tablename__ = "range_runs"
    __table_args__ = (UniqueConstraint("job", "number", name="uq_range_runs_job_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    state: Mapped[str] = mapped_column(String(16), default=RunState.RUNNING)
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    rows: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_base: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_per_s: Mapped[float | None] = mapped_column(nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    # The run's parameters as JSON text (tasks.ranges.params; None: the job takes none;
    # migration 0013).
    params: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Migration 0015 (filled in for older runs from their events).
    number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    skipped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The hooks' outbox (tasks.ranges.hooks; migration 0016): the end state whose hook is
    # owed, set in the transaction that ends the run and cleared when the hook ran (or
    # failed for good); the task id of the hook message that owns it, and when it was sent
    # or last tried (a message lost for RANGE_HOOK_RESEND seconds is sent again).
    hook: Mapped[str | None] = mapped_column(String(16), nullable=True, index=True)
    hook_task: Mapped[str | None] = mapped_column(String(64), nullable=True)
    hook_sent_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # When the plan of a visit-once job's run was made (its bounds read), once per run; None
    # until then, and for filter jobs (tasks.ranges.visits; migration 0018).
    planned_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class RangeRunEvent(Base):
    """The audit of a run: which verb (start, pause, resume, cancel, retry-failed, throttle,
    retry-skipped, the reconciler's succeeded/failed/reopened, and a holder's
    `partition-failed` with the error and its traceback as detail), asked by whom
    (`user@host` of the CLI, `task:ID` of a Celery task, `reconciler`), when, with what
    detail."""

    __tablename__ = "range_run_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(Integer, index=True)
    job: Mapped[str] = mapped_column(String(128))
    verb: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(255))
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class JobSchedule(Base):
    """A range job's cron schedule (tasks.ranges.timetable; migration 0016).

    `cron` None: cleared at runtime (a schedule declared in code stays off until set again).
    `source`: "code" (seeded from `RangeJob.schedule`, follows the code when it changes) or
    "runtime" (set with `jobs schedule`, kept across deploys). Each fire is a compare-and-set
    on `term`, in the transaction that opens the run it starts, so two beats (or two ticks)
    fire one due time once. `queued_due_at`: the due time of the one run the `queue` policy
    holds until the live run ends.
    """

    __tablename__ = "range_job_schedules"

    job: Mapped[str] = mapped_column(String(128), primary_key=True)
    cron: Mapped[str | None] = mapped_column(String(128), nullable=True)
    policy: Mapped[str] = mapped_column(String(16), default="skip")
    missed: Mapped[str] = mapped_column(String(16), default="once")
    source: Mapped[str] = mapped_column(String(16), default="runtime")
    term: Mapped[int] = mapped_column(BigInteger, default=0)
    next_due_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    queued_due_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    last_due_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    last_outcome: Mapped[str | None] = mapped_column(String(255), nullable=True)
    fired: Mapped[int] = mapped_column(BigInteger, default=0)
    skipped: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RangeRunInput(Base):
    """The input of a CSV job's run (tasks.ranges.collections): one row per CSV record, its
    `line` the record's number (1: the first after the header) and `payload` its fields as a
    JSON object keyed by the header. Written in the start's transaction, read by every
    worker; a run's input is deleted by the job's next start (migration 0018)."""

    __tablename__ = "range_run_input"

    run: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    line: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    payload: Mapped[str] = mapped_column(Text)


# The tables, for compare-and-set UPDATEs and bulk reads.
WORK = cast(Table, WorkItem.__table__)
SCHEDULES = cast(Table, Schedule.__table__)
RANGE_RUNS = cast(Table, RangeRun.__table__)
RANGE_RUN_EVENTS = cast(Table, RangeRunEvent.__table__)
JOB_SCHEDULES = cast(Table, JobSchedule.__table__)
RUN_INPUT = cast(Table, RangeRunInput.__table__)
