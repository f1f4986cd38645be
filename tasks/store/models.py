"""SQLAlchemy 2 models, one MetaData (`Base.metadata`) for every table:

    work_items, schedules      range jobs (partitions and their reconcile rounds)
    range_runs, range_run_events    range jobs' runs and who asked for each control (issue 11)
    dead_letters               every wing's dead letters
    skus, orders, order_items, payments, restock_nodes    restock
    rollback_journal, rollback_owners    the rollback journal (defined in tasks.rollback.tables)

The same models run on SQLite, PostgreSQL and MariaDB; Alembic migrations in
`tasks/store/migrations` create them (`python -m tasks migrate`).
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import (
    BigInteger,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tasks.store.db import utcnow

__all__ = ["Base", "WorkItem", "Schedule", "PartitionStatus",
           "WORK", "SCHEDULES", "DeadLetter",
           "DEAD_LETTERS", "RunState", "RangeRun", "RangeRunEvent", "RANGE_RUNS",
           "RANGE_RUN_EVENTS", "ItemState", "Sku", "Order", "OrderItem", "Payment", "RestockNode",
           "SKUS", "ORDERS", "ORDER_ITEMS", "PAYMENTS", "RESTOCK_NODES"]


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


class Base(DeclarativeBase):
    pass


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
    # every finished one (a holder asks it as it finishes; migration 0012).
    __table_args__ = (UniqueConstraint("kind", "job", "part", name="uq_work_items_job_part"),
                      Index("ix_work_items_job_status", "kind", "job", "status"))

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
    when the run ends) counts this run's rows only. `rows_per_s` is the throttle in force
    (None: none); the source of truth the reconciler copies to Redis each round.
    """

    __tablename__ = "range_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    state: Mapped[str] = mapped_column(String(16), default=RunState.RUNNING)
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    rows: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_base: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_per_s: Mapped[float | None] = mapped_column(nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RangeRunEvent(Base):
    """The audit of a run: which verb (start, pause, resume, cancel, retry-failed, throttle,
    and the reconciler's succeeded/failed/reopened), asked by whom (`user@host` of the CLI,
    `task:ID` of a Celery task, `reconciler`), when, with what detail."""

    __tablename__ = "range_run_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(Integer, index=True)
    job: Mapped[str] = mapped_column(String(128))
    verb: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(255))
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class DeadLetter(Base):
    """Something that failed for good (a poison message, a compensation that kept failing):
    kept with its reason and its JSON payload, never dropped."""

    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(64))
    ref: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    # Set once, by `tasks.deadletters.store.DeadLetters.replay` (a compare-and-set on NULL):
    # when the
    # letter's task was sent again and under which new task id (migration 0010).
    replayed_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    replay_task_id: Mapped[str | None] = mapped_column(String(255), nullable=True)


class ItemState:
    """The life of an order item's stock. Only `reserving -> held -> paid`, `held -> released
    -> restocked` and `reserving -> held | released | rejected` happen; each step is a
    compare-and-set on the old state, so a payment and a restock never both win."""

    RESERVING = "reserving"  # recorded; the Redis deduction may or may not have happened
    HELD = "held"  # deducted in Redis, waiting for payment
    PAID = "paid"  # paid: its stock is sold
    RELEASED = "released"  # unpaid past the delay: the drainer gives the stock back
    RESTOCKED = "restocked"  # the stock is back in Redis
    REJECTED = "rejected"  # Redis refused the deduction (not enough stock): holds nothing

    # States whose stock is out of Redis: the rebuild subtracts them from the total.
    OUT = (HELD, PAID)
    RETURNED = (RELEASED, RESTOCKED)


class Sku(Base):
    """A SKU and its total stock: the source of truth the rebuild recomputes Redis from."""

    __tablename__ = "skus"

    sku_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    redis_id: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Order(Base):
    __tablename__ = "orders"

    order_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    member_id: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class OrderItem(Base):
    """One line of an order: `qty` of `sku_id`, deducted on node `redis_id` into `queue`."""

    __tablename__ = "order_items"

    order_item_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    order_id: Mapped[str] = mapped_column(String(128), index=False)
    sku_id: Mapped[str] = mapped_column(String(128))
    qty: Mapped[int] = mapped_column(Integer)
    redis_id: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default=ItemState.RESERVING)
    # The deduction's time on its stock node's clock (Redis TIME), from which its delay runs;
    # 0 until the deduction is recorded.
    time_ms: Mapped[int] = mapped_column(BigInteger)
    entry: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The entry's offset on its node (None until deducted): the database's side of the node's
    # generation, so a node that comes back behind it refuses deductions (migration 0006).
    redo_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Payment(Base):
    __tablename__ = "payments"

    order_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    paid_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RestockNode(Base):
    """A logical stock shard's term (``redis_id`` is the shard number, a name from before
    shards), kept in the database so it only grows even when the shard's Redis restarts
    empty."""

    __tablename__ = "restock_nodes"

    redis_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    term: Mapped[int] = mapped_column(BigInteger, default=0)
    rebuilt_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    next_maintain_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


# Core tables, for compare-and-set UPDATEs and bulk reads.
WORK = cast(Table, WorkItem.__table__)
SCHEDULES = cast(Table, Schedule.__table__)
DEAD_LETTERS = cast(Table, DeadLetter.__table__)
RANGE_RUNS = cast(Table, RangeRun.__table__)
RANGE_RUN_EVENTS = cast(Table, RangeRunEvent.__table__)
SKUS = cast(Table, Sku.__table__)
ORDERS = cast(Table, Order.__table__)
ORDER_ITEMS = cast(Table, OrderItem.__table__)
PAYMENTS = cast(Table, Payment.__table__)
RESTOCK_NODES = cast(Table, RestockNode.__table__)
