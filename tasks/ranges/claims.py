"""The atomic claim of a job's next pending partitions (pull-based scheduling).

A runner that finished a partition, and the reconciler when it tops runners up, reserve the
next pending partitions themselves in the database: one transaction marks up to `n` of them
`dispatched_at = now`, and a partition reserved less than `hold` seconds ago is nobody else's
to take. The reservation is not the ownership: the reserver then acquires the partition's
lease and claims its work row with the fence (`workrow.WorkRow.claim`), as every holder does,
so the reservation only keeps two claimers from racing for the same lease. A reserver that
dies before it claimed the row leaves a reservation that lapses after `hold` seconds.

Per database (two claimers never get the same partition):

    PostgreSQL  SELECT ... ORDER BY part LIMIT n FOR UPDATE SKIP LOCKED, then the UPDATE
    MariaDB     of those rows; they are locked by this transaction, so every one of them
                matched. (Not one UPDATE ... WHERE id IN (that SELECT): PostgreSQL may run
                a LIMIT ... FOR UPDATE subquery more than once and reserve more than n;
                MariaDB takes no LIMIT in an IN subquery.)
    SQLite      one writer at a time (the transaction takes the write lock up front): one
                statement, UPDATE ... WHERE id IN (SELECT ... ORDER BY part LIMIT n)
                RETURNING part. The rows the subquery picks are free when the UPDATE writes
                them (nobody else writes meanwhile); with the free test repeated outside,
                SQLite would walk every pending row by the index and test it against the list

Cost: an index range of the job's pending partitions in partition order
(`ix_work_items_job_status_part`), stopping after `n` unreserved ones; never a read or a sort
of the whole plan.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Integer, and_, bindparam, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.runs import writing
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import RANGE_KIND
from tasks.store.db import utcnow

__all__ = ["claim_pending"]

# Built once (a runner claims before each partition); the job, the cut-off and `n` are bound.
_FREE = and_(WORK.c.kind == RANGE_KIND, WORK.c.job == bindparam("claim_job"),
             WORK.c.status == S.PENDING,
             or_(WORK.c.dispatched_at.is_(None), WORK.c.dispatched_at < bindparam("cutoff")))
_CHOOSE = (select(WORK.c.id, WORK.c.part).where(_FREE).order_by(WORK.c.part)
           .limit(bindparam("n", type_=Integer)).with_for_update(skip_locked=True))
_RESERVE = (update(WORK).where(WORK.c.id.in_(bindparam("ids", expanding=True)), _FREE)
            .values(dispatched_at=bindparam("reserved_at")))
_PICK = select(WORK.c.id).where(_FREE).order_by(WORK.c.part).limit(bindparam("n", type_=Integer))
_TAKE = (update(WORK).where(WORK.c.id.in_(_PICK))
         .values(dispatched_at=bindparam("reserved_at")).returning(WORK.c.part))


def claim_pending(sessions: sessionmaker[Session], job: str, n: int, *,
                  hold: float) -> list[int]:
    """Reserve up to `n` pending partitions of `job` (lowest numbers first) that nobody
    reserved in the last `hold` seconds; returns their numbers (fewer, or none, when fewer
    are free)."""
    if n <= 0:
        return []
    now = utcnow()
    free = {"claim_job": job, "cutoff": now - timedelta(seconds=hold), "reserved_at": now}
    with writing(sessions) as session:  # SQLite: the write lock up front (BEGIN IMMEDIATE)
        if session.get_bind().dialect.name == "sqlite":
            return sorted(int(p) for p in session.execute(_TAKE, {**free, "n": n}).scalars())
        chosen = session.execute(_CHOOSE, {**free, "n": n}).all()
        if chosen:  # every chosen row is locked by this transaction
            session.execute(_RESERVE, {**free, "ids": [row.id for row in chosen]})
        return sorted(int(row.part) for row in chosen)
