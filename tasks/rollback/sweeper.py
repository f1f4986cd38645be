"""The sweeper: finds the journals whose owner is gone, fences the owner out, rolls them back.

It catches what no signal can: a hard time limit, a SIGKILLed pool process or worker, a pause
past the lease TTL, Redis losing the lease. A journal's owner may be gone when its journal
lease is (and, for a journal handed over to a retry, its handover marker too); the takeover is
a compare-and-set on its owners row, so an owner that is in fact alive is fenced out in the
database and can neither add a step nor succeed. Retention: compensated and dead rows, and
closed owners rows, are deleted JOURNAL_RETENTION seconds after their last change.

`Sweeper.take_back` is the same decision for one journal: the `tasks.rollback.rollback` task
uses it, so whatever signal or caller sends that task, it compensates only where a sweep would.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Select, case, delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from lease.keys import lease_key
from tasks.observe.metrics import record
from tasks.rollback.keys import handover_key, journal_lease_name
from tasks.rollback.metrics import RollbackSeries
from tasks.rollback.runner import (
    COMPENSATION_POLICY,
    STUCK_AFTER,
    Ownership,
    RollbackReport,
    RollbackRunner,
)
from tasks.rollback.tables import JOURNAL, OWNERS, JournalState, OwnerState
from tasks.store.db import affected, utcnow
from tasks.worker.retry import RetryPolicy

__all__ = ["Candidate", "Sweeper", "TakeBack", "sweep"]

log = logging.getLogger("tasks.rollback")

_UNFINISHED = (*JournalState.PENDING, JournalState.COMPENSATING)


@dataclass
class Candidate:
    """A journal the sweeper may have to roll back."""

    task_id: str
    owner: str | None  # None: no open owners row (closed, or a journal from before 0007)
    state: str | None
    upto: int = 0  # the newest row id when looked at (for closed journals)
    stuck: bool = False  # closed, with a row 'compensating' for longer than STUCK_AFTER


@dataclass(frozen=True)
class TakeBack:
    """What `Sweeper.take_back` did with one journal.

    outcome: ROLLED_BACK (taken over by compare-and-set, or closed already, and its pending
    steps compensated: `report`), OWNER_ALIVE (its journal lease or handover marker is held:
    nothing done; `alive_for` is how long that claim lasts unless its owner renews it), or
    NOTHING (no open journal and no pending step: it settled or was rolled back already).
    """

    ROLLED_BACK = "rolled_back"
    OWNER_ALIVE = "owner_alive"
    NOTHING = "nothing_to_do"

    outcome: str
    report: RollbackReport | None = None
    alive_for: float = 0.0


def _claim_left(state: str | None, lease_pttl: int, marker_pttl: int) -> float | None:
    """Seconds the owner's claim on a journal lasts unless renewed, from the PTTLs of its
    journal lease and its handover marker (-2: no such key); None: the owner may be gone."""
    if lease_pttl != -2:
        return max(lease_pttl, 0) / 1000
    if state == OwnerState.HANDED_OVER and marker_pttl != -2:
        return max(marker_pttl, 0) / 1000
    return None


class Sweeper:
    """Rolls back the journals on one database whose owner is gone (needs no Leases: it only
    looks whether a lease key exists)."""

    def __init__(self, sessions: sessionmaker[Session],
                 policy: RetryPolicy = COMPENSATION_POLICY) -> None:
        self.sessions = sessions
        self.runner = RollbackRunner(sessions, policy)

    def candidates(self, task_id: str | None = None) -> list[Candidate]:
        """Every open journal, and every closed one that still has pending rows (with
        `task_id`, only that task's)."""
        owned_q = (select(OWNERS.c.task_id, OWNERS.c.owner, OWNERS.c.state)
                   .where(OWNERS.c.state.in_(OwnerState.OPEN)))
        # A journal with a pending row, and its newest row still to finish: a row above the
        # pending ones may be 'compensating', and the walk must see it to keep the order.
        is_pending = case((JOURNAL.c.state.in_(JournalState.PENDING), 1), else_=0)
        pending_q = (select(JOURNAL.c.task_id, func.max(JOURNAL.c.id))
                     .where(JOURNAL.c.state.in_(_UNFINISHED))
                     .group_by(JOURNAL.c.task_id).having(func.sum(is_pending) > 0))
        stuck_q = self._stuck_query()
        if task_id is not None:
            owned_q = owned_q.where(OWNERS.c.task_id == task_id)
            pending_q = pending_q.where(JOURNAL.c.task_id == task_id)
            stuck_q = stuck_q.where(JOURNAL.c.task_id == task_id)
        with self.sessions() as session:
            owned = session.execute(owned_q).all()
            stuck = session.execute(stuck_q).all()
            pending = session.execute(pending_q).all()
        found = {t: Candidate(t, owner, state) for t, owner, state in owned}
        for task_id, owner, state, upto in stuck:
            found.setdefault(task_id, Candidate(task_id, owner, state, int(upto), stuck=True))
        for task_id, upto in pending:
            found.setdefault(task_id, Candidate(task_id, None, None, int(upto)))
        return list(found.values())

    @staticmethod
    def _stuck_query() -> Select[Any]:
        """Closed journals with a row 'compensating' for longer than STUCK_AFTER: its runner
        (a sweep whose worker was killed, say) is taken to be dead, and a takeover fences it
        in case it is not."""
        cutoff = utcnow() - timedelta(seconds=STUCK_AFTER)
        return (select(JOURNAL.c.task_id, OWNERS.c.owner, OWNERS.c.state, func.max(JOURNAL.c.id))
                .join(OWNERS, OWNERS.c.task_id == JOURNAL.c.task_id)
                .where(JOURNAL.c.state == JournalState.COMPENSATING,
                       JOURNAL.c.updated_at < cutoff, OWNERS.c.state.in_(OwnerState.CLOSED))
                .group_by(JOURNAL.c.task_id, OWNERS.c.owner, OWNERS.c.state))

    def orphans(self, redis_client: Any) -> list[Candidate]:
        """The journals whose owner may be gone: no journal lease, and for a handed-over one
        no handover marker either. Their snapshot is taken before Redis is asked, so rows a
        new owner writes after acquiring the lease are never among them."""
        found = self.candidates()
        return [c for c, left in zip(found, self._claims(redis_client, found), strict=True)
                if left is None]

    @staticmethod
    def _claims(redis_client: Any, found: list[Candidate]) -> list[float | None]:
        """For each candidate, how long its owner's claim lasts (see `_claim_left`); one
        round trip."""
        if not found:
            return []
        pipe = redis_client.pipeline(transaction=False)
        for c in found:
            pipe.pttl(lease_key(journal_lease_name(c.task_id)))
            pipe.pttl(handover_key(c.task_id))
        ttls = pipe.execute()
        return [_claim_left(c.state, ttls[2 * i], ttls[2 * i + 1]) for i, c in enumerate(found)]

    def take_over(self, c: Candidate) -> tuple[int, Ownership] | None:
        """Fence out the owner of an orphaned open (or stuck) journal: return the newest row
        id it wrote (the rows to roll back) and the new ownership to roll them back under, or
        None if it changed hands meanwhile.

        The owners row gets a new token: every runner of the old owner (its own rollback
        hung in a compensation, say) is fenced by (owner, state), so the rows it left
        'compensating' are ours to run again."""
        taken = Ownership(f"sweeper:{uuid.uuid4().hex}", OwnerState.TAKEN_OVER)
        with self.sessions.begin() as session:
            if affected(session.execute(update(OWNERS).where(
                OWNERS.c.task_id == c.task_id, OWNERS.c.owner == c.owner,
                OWNERS.c.state == c.state,
            ).values(owner=taken.owner, state=taken.state, updated_at=utcnow()))) != 1:
                return None
            # In the same transaction: the old owner can add no row after this, and a new
            # one cannot take the row before we commit, so these are exactly the old rows.
            upto = session.execute(select(func.max(JOURNAL.c.id))
                                   .where(JOURNAL.c.task_id == c.task_id)).scalar()
        log.warning("took over the journal of %s from its lost owner (%s)", c.task_id, c.state)
        return int(upto or 0), taken

    def _roll(self, c: Candidate, reason: str) -> RollbackReport | None:
        """Take `c` over if it is open or stuck, and roll it back; None if it changed hands
        meanwhile."""
        if c.state not in OwnerState.OPEN and not c.stuck:
            return self.runner.rollback(c.task_id, reason, upto_id=c.upto)
        taken = self.take_over(c)
        if taken is None:
            return None
        upto, ownership = taken
        return self.runner.rollback(c.task_id, reason, upto_id=upto, ownership=ownership,
                                    adopt=True)

    def sweep(self, redis_client: Any) -> int:
        """Roll back every journal whose owner is gone; return how many rollbacks ran a step."""
        rolled = 0
        if record.on is not None:
            record.on.of(RollbackSeries).rollback_sweeps.inc()
        for c in self.orphans(redis_client):
            report = self._roll(c, "sweeper: the journal's owner is gone")
            rolled += bool(report is not None and report.steps)
        return rolled

    def take_back(self, redis_client: Any, task_id: str, reason: str) -> TakeBack:
        """Roll back the journal of `task_id` only where a sweep would: its owner's claim is
        gone (no journal lease, no handover marker) and, if the journal is open, its owners
        row was taken over by compare-and-set, which fences the owner out if it still runs.
        A live owner's journal is left alone (OWNER_ALIVE)."""
        for _ in range(3):
            found = self.candidates(task_id)
            if not found:
                return TakeBack(TakeBack.NOTHING)
            [left] = self._claims(redis_client, found)
            if left is not None:
                return TakeBack(TakeBack.OWNER_ALIVE, alive_for=left)
            [c] = found
            report = self._roll(c, reason)
            if report is None:
                continue  # it changed hands meanwhile (a sweep, a new delivery): look again
            return TakeBack(TakeBack.ROLLED_BACK, report)
        # Three lost compare-and-sets in a row: live processes keep taking it.
        return TakeBack(TakeBack.OWNER_ALIVE)

    def prune(self, retention: float) -> tuple[int, int]:
        """Delete finished rows and closed owners rows older than `retention` seconds;
        return (rows, owners) deleted. Rows 'compensating' are never deleted: a sweep takes
        them over once they are stuck (`_stuck_query`)."""
        cutoff = utcnow() - timedelta(seconds=retention)
        left = select(JOURNAL.c.id).where(JOURNAL.c.task_id == OWNERS.c.task_id).exists()
        with self.sessions.begin() as session:
            rows = affected(session.execute(delete(JOURNAL).where(
                JOURNAL.c.state.in_(JournalState.FINISHED), JOURNAL.c.updated_at < cutoff)))
            owners = affected(session.execute(delete(OWNERS).where(
                OWNERS.c.state.in_(OwnerState.CLOSED), OWNERS.c.updated_at < cutoff, ~left)))
        if rows or owners:
            log.info("journal retention: deleted %d rows and %d owners", rows, owners)
        return rows, owners


def sweep(sessions: sessionmaker[Session], redis_client: Any,
          policy: RetryPolicy = COMPENSATION_POLICY, retention: float | None = None) -> int:
    """Roll back every journal whose owner is gone; return how many rollbacks ran a step.

    Catches what no signal can: a hard time limit, a SIGKILLed pool process or worker, a pause
    past the lease TTL. With `retention`, also deletes what is older than that (seconds).
    """
    sweeper = Sweeper(sessions, policy)
    rolled = sweeper.sweep(redis_client)
    if retention is not None:
        sweeper.prune(retention)
    return rolled
