"""The atomic claim of a job's next pending partitions (pull-based scheduling).

A runner that finished a partition, and the reconciler when it tops runners up, reserve the
next pending partitions themselves in the database: one transaction marks up to `n` of them
`dispatched_at = now`, and a partition reserved less than `hold` seconds ago is nobody else's
to take. The reservation is not the ownership: the reserver then acquires the partition's
lease and claims its work row with the fence (`workrow.WorkRow.claim`), as every holder does,
so the reservation only keeps two claimers from racing for the same lease. A reserver that
dies before it claimed the row leaves a reservation that lapses after `hold` seconds.

Per database (two claimers never get the same partition):

    PostgreSQL  SELECT ... ORDER BY part LIMIT n FOR UPDATE SKIP LOCKED, then
                UPDATE ... WHERE id IN (those) AND <still pending, not reserved> RETURNING part
    MariaDB     the same SELECT ... FOR UPDATE SKIP LOCKED (10.6+) in the transaction, then
                the UPDATE; the selected rows are locked by us, so every one of them matched
    SQLite      one writer at a time (the transaction takes the write lock up front): the
                SELECT, then the compare-and-set UPDATE ... RETURNING part, which matches
                only rows still pending and unreserved

Cost: an index range of the job's pending partitions in partition order
(`ix_work_items_job_status_part`), stopping after `n` unreserved ones; never a read or a sort
of the whole plan.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.runs import writing
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import partitions_of
from tasks.store.db import utcnow

__all__ = ["claim_pending"]


def claim_pending(sessions: sessionmaker[Session], job: str, n: int, *,
                  hold: float) -> list[int]:
    """Reserve up to `n` pending partitions of `job` (lowest numbers first) that nobody
    reserved in the last `hold` seconds; returns their numbers (fewer, or none, when fewer
    are free)."""
    if n <= 0:
        return []
    now = utcnow()
    free = and_(partitions_of(job), WORK.c.status == S.PENDING,
                or_(WORK.c.dispatched_at.is_(None),
                    WORK.c.dispatched_at < now - timedelta(seconds=hold)))
    with writing(sessions) as session:  # SQLite: the write lock up front (BEGIN IMMEDIATE)
        dialect = session.get_bind().dialect
        query = select(WORK.c.id, WORK.c.part).where(free).order_by(WORK.c.part).limit(n)
        if dialect.name != "sqlite":
            query = query.with_for_update(skip_locked=True)
        chosen = session.execute(query).all()
        if not chosen:
            return []
        reserve = update(WORK).where(WORK.c.id.in_([row.id for row in chosen]), free) \
            .values(dispatched_at=now)
        if dialect.update_returning:
            return sorted(int(p) for p in session.execute(
                reserve.returning(WORK.c.part)).scalars())
        session.execute(reserve)  # MariaDB: every chosen row is locked by this transaction
        return sorted(int(row.part) for row in chosen)
