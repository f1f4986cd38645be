"""Visit-once range jobs (`visits="once"`): read-only and external-effect jobs.

An export, a reindex into a search engine, a notification or a cache warm-up changes nothing
a filter could see, so the filter job's contract (process makes a row stop matching `where`,
and a closing read with that filter decides when a run ends) cannot hold for it. A
visit-once job promises its place instead:

    start       the run opens; a job whose last run ended gets a fresh plan (its old
                partitions are deleted in the start's transaction, their highest fence kept
                as the floor of the new ones)
    plan        the run's first reconcile round reads the key bounds (min, max) once and
                plans partitions over exactly that range (the last one ends at max, not at
                the partition size's grid); `range_runs.planned_at` is set in the same
                transaction, and no round of this run plans again
    batches     each batch reads the next rows from the partition's cursor (the job's
                selection, if it has one), runs `process`, and commits its effects with
                the cursor moved past the last row read, guarded by the lease's fence
    done        a partition is done in the transaction of the read that reaches its upper
                bound; the run succeeds when every partition is done (no closing read)

Guarantee: every row committed before the plan's bounds read (and still there, and matching
the selection, when its partition's cursor reaches it) is visited by exactly one committed
batch of the run. Rows inserted after that read with a key above the plan's upper bound (or
below its lower bound) are not visited. A row inserted during the run with a key inside the
plan's range is visited if it is committed before its partition's cursor passes its key, and
not visited otherwise (a row committing below the cursor, with an id allocated earlier, is
left for the next run). A row updated during the run is visited once, as the batch read it.

Effects outside the database are not in the batch's transaction: a batch whose holder dies
after sending them is read again by the next holder and sends them again. They carry
`ctx.idempotency_key(row)`, `JOB:RUN:KEY`, the same on every retry within the run, so a
receiver that accepts each key once applies each row's effect once per run; the next run has
a new run id, so it visits every row again.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tasks.ranges.planning import Partition, plan_partitions
from tasks.ranges.tables import RANGE_RUNS, RunState
from tasks.store.db import affected

__all__ = ["plan_once", "unplanned_run", "mark_planned", "is_planned"]


def plan_once(lo: int | None, hi: int | None, size: int) -> list[Partition]:
    """A visit-once run's partitions: those of a first plan of `lo..hi`, the first starting at
    `lo` and the last ending at `hi` (not at the grid's edge), so a row inserted later with a
    key outside `lo..hi` is not visited. None for an empty table."""
    parts = plan_partitions(lo, hi, size)
    if not parts:
        return parts
    assert lo is not None and hi is not None
    parts[0] = parts[0]._replace(lo=max(parts[0].lo, lo))
    parts[-1] = parts[-1]._replace(hi=min(parts[-1].hi, hi))
    return parts


def unplanned_run(session: Session, job: str) -> int | None:
    """The id of `job`'s latest run if it is running and its plan is not made yet."""
    row = session.execute(select(RANGE_RUNS.c.id, RANGE_RUNS.c.state, RANGE_RUNS.c.planned_at)
                          .where(RANGE_RUNS.c.job == job)
                          .order_by(RANGE_RUNS.c.id.desc()).limit(1)).first()
    if row is None or row.state != RunState.RUNNING or row.planned_at is not None:
        return None
    return int(row.id)


def mark_planned(session: Session, run: int, at: datetime) -> bool:
    """Record that run `run`'s plan was made from a bounds read at `at` (compare-and-set:
    False if it was already)."""
    return affected(session.execute(update(RANGE_RUNS).where(
        RANGE_RUNS.c.id == run, RANGE_RUNS.c.planned_at.is_(None)).values(planned_at=at))) == 1


def is_planned(session: Session, run: int) -> bool:
    """Whether run `run`'s plan was made."""
    return session.execute(select(RANGE_RUNS.c.planned_at).where(
        RANGE_RUNS.c.id == run)).scalar() is not None
