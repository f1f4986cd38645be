"""The batches of one run of a partition: the keyset pass, then the closing pass.

Each batch is one transaction: read the rows, guard the work row by the holder's fence (moving
the checkpoint), run the job's process function. The guard UPDATE is the first write of the
transaction, so on PostgreSQL and MariaDB it also row-locks the work row: a claim by a newer
holder waits for an in-flight batch to commit, then reads its checkpoint. On SQLite the
transaction begins IMMEDIATE (it will write).

Which rows a run processes (README): the keyset pass walks `id >= next_id`, which misses a row
whose transaction took its id early and committed late (concurrent inserters commit out of id
order). So a partition is never marked done after its keyset pass alone: a closing pass reads
`lo..hi` from the start with the job's filter (rows still to do) and processes what it finds,
until a closing read finds nothing; that read and the `done` update are one transaction.

    t0  keyset pass: rows 1..100 committed; 101 (inserter A) is still uncommitted, 102
        (inserter B) commits; the runner processes 102, its next read from 103 is empty
    t1  A commits 101
    t2  closing read of 1..hi with `status = 0` finds 101: processed; the next closing read
        finds nothing, and the partition is done in that same transaction

A row committed after the closing read is found by the reconciler's late-commit check
(`RANGE_SETTLE` after the partition finished) or, above the checkpoint, by its growth check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, select
from sqlalchemy.orm import Session

from tasks.db import WRITE_INTENT, affected, utcnow
from tasks.metrics import record
from tasks.models import WORK
from tasks.ranges.jobs import Context
from tasks.ranges.outcomes import FencedOut, FilterNotCleared
from tasks.ranges.planning import Partition
from tasks.ranges.sizing import Sizer
from tasks.ranges.skips import Skips, quarantined_ids
from tasks.ranges.workrow import WorkRow

__all__ = ["Batches", "Cursor"]


@dataclass
class Cursor:
    """Where a run is: the keyset cursor, and the closing pass once the keyset pass is done."""

    next_id: int
    closing: bool = False
    checked: bool = False  # the filter contract was checked on a batch of this run
    closed_ids: frozenset[int] = frozenset()  # ids the previous closing batch processed


class Batches:
    """The batches of one run of `row`'s partition, from checkpoint `next_id`.

    `started` is when the run began on `clock` (the rate stored with each checkpoint).
    `lease_ttl` bounds an adaptive batch (`tasks.ranges.sizing`). A job with a skip policy
    (`tasks.ranges.skips`) reads its partition's quarantined ids once here and leaves them out.
    """

    def __init__(self, row: WorkRow, partition: Partition, *, next_id: int,
                 clock: Callable[[], float] = time.monotonic,
                 started: float | None = None, lease_ttl: float = float("inf")) -> None:
        self.row, self.job, self.partition = row, row.job, partition
        self.clock = clock
        self.started = clock() if started is None else started
        self.cursor = Cursor(next_id)
        self.rows_done = 0
        job = self.job
        self.sizer = Sizer(job.batch_size, job.target_batch_s, job.min_batch_size,
                           job.max_batch_size, lease_ttl)
        self.skips: Skips | None = None
        if job.skip_on:
            with row.sessions() as session:
                self.skips = Skips(job, partition.part,
                                   quarantined_ids(session, job.name, partition.part))
        columns = [job.table.c[c] for c in job.columns] if job.columns else [job.table]
        self._query = (select(*columns)
                       .where(job.id_col >= bindparam("from_id"), job.id_col <= partition.hi,
                              job.where)
                       .order_by(job.id_col).limit(bindparam("size")))
        self._quarantined: frozenset[int] = frozenset()
        self._pending_skips: frozenset[int] = frozenset()  # quarantined by the open batch
        self._read = self._query
        self._leave_out()
        self._top = select(func.max(job.id_col)).where(job.id_col >= partition.lo,
                                                       job.id_col <= partition.hi)
        self._guard = row.checkpoint_statement()

    def step(self, fence: int, pool: ThreadPoolExecutor | None) -> int | str | None:
        """Process one batch as the holder of `fence`; return the new checkpoint, None when
        the keyset pass is done (the closing pass starts), or the final status when a closing
        read found nothing. `FencedOut` if a newer holder owns the partition."""
        began, rows_before = self.clock(), self.rows_done
        found: int | str | None
        if self.cursor.closing:
            found = self._closing_batch(fence, pool)
        else:
            found = self._keyset_batch(fence, pool)
            if found is None:
                self.cursor.closing = True
        if self.rows_done > rows_before:
            rows, seconds = self.rows_done - rows_before, self.clock() - began
            self.sizer.observe(rows, seconds)
            if record.on is not None:
                self._count(record.on, rows, seconds)
        return found

    def _count(self, metrics: Any, rows: int, seconds: float) -> None:
        job = self.job.name
        metrics.range_rows.labels(job).inc(rows)
        metrics.range_batches.labels(job).inc()
        metrics.range_batch_seconds.labels(job).observe(seconds)
        metrics.range_batch_size.labels(job).set(self.sizer.size)

    def _keyset_batch(self, fence: int, pool: ThreadPoolExecutor | None) -> int | None:
        with self.row.sessions.begin() as session:
            conn = session.connection(execution_options=WRITE_INTENT)
            rows = conn.execute(self._read, {"from_id": self.cursor.next_id,
                                             "size": self.sizer.size}).all()
            if not rows:
                return None
            checkpoint, done = self._process(session, conn, fence, rows, pool,
                                             check=not self.cursor.checked)
        return self._advance(checkpoint, done)

    def _closing_batch(self, fence: int, pool: ThreadPoolExecutor | None) -> int | str:
        with self.row.sessions.begin() as session:
            conn = session.connection(execution_options=WRITE_INTENT)
            # The highest id read *before* the closing read: a row committed after that read
            # with a higher id reopens the partition (growth); one with an id up to `top` is
            # found by the late-commit check.
            top = conn.execute(self._top).scalar()
            rows = conn.execute(self._read, {"from_id": self.partition.lo,
                                             "size": self.sizer.size}).all()
            if not rows:
                next_id = self.cursor.next_id
                return self.row.finish(conn, fence,
                                       max(next_id, top + 1) if top is not None else next_id)
            self._refuse_repeats(rows)
            checkpoint, done = self._process(session, conn, fence, rows, pool, check=True)
        return self._advance(checkpoint, done)

    def _process(self, session: Session, conn: Connection, fence: int,
                 rows: Sequence[Row[Any]], pool: ThreadPoolExecutor | None, *,
                 check: bool) -> tuple[int, int]:
        """Guard the work row, then run the job on `rows`, in the batch's transaction; return
        the new checkpoint and how many rows were processed (not skipped)."""
        last = int(getattr(rows[-1], self.job.id_column))
        checkpoint = max(self.cursor.next_id, last + 1)  # closing rows may lie below the cursor
        rate = (self.rows_done + len(rows)) / max(self.clock() - self.started, 1e-6)
        guarded = affected(conn.execute(self._guard, {
            "mine": fence, "checkpoint": checkpoint, "batch_rows": len(rows),
            "now": utcnow(), "rows_per_s": rate}))
        if guarded != 1:
            raise FencedOut()
        exact = conn.dialect.name == "sqlite"  # the write lock is held from the read on

        def run(chunk: Sequence[Row[Any]]) -> None:
            first, last = (int(getattr(chunk[i], self.job.id_column)) for i in (0, -1))
            span = (first, last) if exact and self._clear_of_quarantine(first, last) else None
            self.job.process(chunk, Context(session, fence, self.job, self.partition, pool,
                                            span))

        skipped = self.skips.process(session, rows, fence, run) if self.skips else []
        if self.skips is None:
            run(rows)
        elif skipped:
            rows = [r for r in rows if int(getattr(r, self.job.id_column)) not in skipped]
            conn.execute(self.row.guard(fence).values(rows_done=WORK.c.rows_done - len(skipped)))
        if check and rows:
            self._check_cleared(conn, rows)
            self.cursor.checked = True
        self._pending_skips = frozenset(skipped)
        return checkpoint, len(rows)

    def _advance(self, checkpoint: int, rows: int) -> int:
        """After a batch committed: the cursor moves on (past the rows it quarantined)."""
        self.rows_done += rows
        self.cursor.next_id = checkpoint
        if self.skips is not None and self._pending_skips:
            self.skips.quarantined |= self._pending_skips
            self._pending_skips = frozenset()
            self._leave_out()
        return checkpoint

    def _leave_out(self) -> None:
        """Reads leave out the partition's quarantined rows (they still match the filter)."""
        if self.skips is None or self.skips.quarantined == self._quarantined:
            return
        self._quarantined = self.skips.quarantined
        self._read = self._query.where(self.job.id_col.not_in(sorted(self._quarantined)))

    def _clear_of_quarantine(self, first: int, last: int) -> bool:
        return not any(first <= q <= last for q in self._quarantined)

    def _refuse_repeats(self, rows: Sequence[Row[Any]]) -> None:
        """Two closing batches in a row that read the same id: its row still matches."""
        ids = frozenset(int(getattr(r, self.job.id_column)) for r in rows)
        again = ids & self.cursor.closed_ids
        if again:
            raise FilterNotCleared(
                f"range job {self.job.name}: row {min(again)} still matches the job's filter "
                "after it was processed (the process function must make processed rows stop "
                "matching `where`)")
        self.cursor.closed_ids = ids

    def _check_cleared(self, conn: Connection, rows: Sequence[Row[Any]]) -> None:
        """The job's contract: a processed row no longer matches its filter (checked on the
        first batch of a run and on closing batches; a failure rolls the batch back)."""
        job = self.job
        ids = [getattr(r, job.id_column) for r in rows]
        left = conn.execute(select(job.id_col).where(job.id_col.in_(ids), job.where)
                            .limit(1)).scalar()
        if left is not None:
            raise FilterNotCleared(
                f"range job {job.name}: row {left} still matches the job's filter after it was "
                "processed (the process function must make processed rows stop matching "
                "`where`); nothing of this batch was written")
