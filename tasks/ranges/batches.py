"""The batches of one run of a partition: a keyset pass over `lo..hi`.

Each batch is one transaction: read the rows, guard the work row by the holder's fence (moving
the checkpoint), run the job's process function. The guard UPDATE is the first write of the
transaction, so on PostgreSQL and MariaDB it also row-locks the work row: a claim by a newer
holder waits for an in-flight batch to commit, then reads its checkpoint. On SQLite the
transaction begins IMMEDIATE (it will write); on PostgreSQL it is REPEATABLE READ, so its
writes see the snapshot its read saw and a row committed in between is not touched (what makes
`Context.span` exact there: `snapshot_options`).

The keyset pass walks `id >= next_id` and ends at its first empty read or at a read shorter
than it asked for: that read saw every matching row up to `hi`, and the partition is marked
done in its transaction. The pass misses a row whose id lies below the cursor but whose
transaction commits later (an id allocated early: a sequence cache, an id block, an
application id); the run's closing round, once every partition finished, reads the table with
the job's filter and sends the partitions of such rows back to work, from `lo`
(`tasks.ranges.closing`). One read per run, not one per partition (docs/decisions.md, "One
closing read per run"). For a visit-once job (`tasks.ranges.visits`) the pass is all: its
cursor reached `hi`; it has no filter contract to check and no closing round.

A keyed job (tasks.ranges.jobkeys) walks its partition the same way by key: each read takes
the rows whose key is above the cursor (the last key read), the cursor is stored beside the
checkpoint (`next_key`), and `next_id` counts the rows read, for progress.

The reads themselves (rows off the driver's cursor as plain tuples when they need no
conversion) are `tasks.ranges.reads`; every write to the work row, the guard included, is a
method of `tasks.ranges.workrow.WorkRow`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, and_, select, tuple_
from sqlalchemy.orm import Session

from tasks.observe.metrics import record
from tasks.ranges.jobkeys import KeyValue
from tasks.ranges.jobs import Context
from tasks.ranges.metrics import RangeSeries
from tasks.ranges.outcomes import FilterNotCleared
from tasks.ranges.planning import Partition
from tasks.ranges.reads import BatchRows, Reads, built, id_at, ids_of
from tasks.ranges.sizing import SETTLED, Sizer
from tasks.ranges.skips import Skips, quarantined_ids
from tasks.ranges.workrow import WorkRow
from tasks.store.db import WRITE_INTENT

__all__ = ["Batches", "Cursor", "CHECK_CHUNK", "snapshot_options", "exact_span"]

CHECK_CHUNK = 5000  # ids per statement of the filter-contract check (under every bind limit)

# A batch's transaction on PostgreSQL: one snapshot for its reads and its writes.
_SNAPSHOT = {**WRITE_INTENT, "isolation_level": "REPEATABLE READ"}


def snapshot_options(dialect: str) -> dict[str, Any]:
    """The execution options of a batch's transaction. SQLite: the write lock from the read on
    (nothing commits in between). PostgreSQL: REPEATABLE READ, whose UPDATE finds only rows of
    the transaction's snapshot (taken by the read), so a row another transaction commits into
    the batch's id range meanwhile is left for the closing round, and a read row changed
    meanwhile fails the batch with a serialization error (retried like any transient error).
    MariaDB's UPDATE reads the newest rows at any level: there the transaction is as before."""
    return _SNAPSHOT if dialect == "postgresql" else WRITE_INTENT


def exact_span(conn: Connection) -> bool:
    """Whether an UPDATE by a batch's id range touches exactly the rows its read returned."""
    if conn.dialect.name == "sqlite":
        return True
    return conn.get_execution_options().get("isolation_level") == "REPEATABLE READ"


@dataclass
class Cursor:
    """Where a run is: the keyset cursor."""

    next_id: int
    checked: bool = False  # the filter contract was checked on a batch of this run
    key: KeyValue | None = None  # a keyed job's: the last key read (None: from the first)


# A place in the pass: the checkpoint and, for a keyed job, the last key read.
At = tuple[int, KeyValue | None]


class Batches:
    """The batches of one run of `row`'s partition, from checkpoint `next_id`.

    `started` is when the run began on `clock` (the rate stored with each checkpoint).
    `lease_ttl` bounds an adaptive batch (`tasks.ranges.sizing`). A job with a skip policy
    (`tasks.ranges.skips`) reads its partition's quarantined ids once here and leaves them out.
    """

    def __init__(self, row: WorkRow, partition: Partition, *, next_id: int,
                 clock: Callable[[], float] = time.monotonic,
                 started: float | None = None, lease_ttl: float = float("inf"),
                 params: Any = None, run: int | None = None,
                 next_key: KeyValue | None = None) -> None:
        self.row, self.job, self.partition = row, row.job, partition
        self.params = params  # the run's parameters (ctx.params; the filter's argument)
        self.run = run  # the run's id (ctx.run, ctx.idempotency_key)
        self.clock = clock
        self.started = clock() if started is None else started
        self.cursor = Cursor(next_id, key=next_key)
        self.rows_done = 0
        job = self.job
        self.sizer = Sizer(SETTLED.get(job) or job.batch_size, job.target_batch_s,
                           job.min_batch_size, job.max_batch_size, lease_ttl)
        self.skips: Skips | None = None
        if job.skip_on:
            with row.sessions() as session:
                self.skips = Skips(job, partition.part,
                                   quarantined_ids(session, job.name, partition.part))
        where = job.filter(params)
        scope = job.run_scope(run)  # a CSV job reads its own run's input
        if scope is not None:
            where = and_(where, scope)
        self._where = where
        self.reads = Reads(job, partition.hi, where, partition.hi_key)
        self._pending_skips: frozenset[int] = frozenset()  # quarantined by the open batch
        self._leave_out()
        statements = built(job, where)
        self._left_in_range, self._left = statements.left_in_range, statements.left

    @property
    def size(self) -> int:
        """Rows the next batch reads at most (`tasks.ranges.sizing`)."""
        return self.sizer.size

    def step(self, fence: int, pool: ThreadPoolExecutor | None) -> int | str:
        """Process one batch as the holder of `fence`; return the new checkpoint, or the
        partition's final status when the keyset pass ended in this batch's transaction.
        `FencedOut` if a newer holder owns the partition."""
        began, rows_before = self.clock(), self.rows_done
        found = self._keyset_batch(fence, pool)
        if self.rows_done > rows_before:
            rows, seconds = self.rows_done - rows_before, self.clock() - began
            SETTLED.put(self.job, self.sizer.observe(rows, seconds))
            if record.on is not None:
                self._count(record.on.of(RangeSeries), rows, seconds)
        return found

    def _count(self, metrics: Any, rows: int, seconds: float) -> None:
        job = self.job.name
        metrics.range_rows.labels(job).inc(rows)
        metrics.range_batches.labels(job).inc()
        metrics.range_batch_seconds.labels(job).observe(seconds)
        metrics.range_batch_size.labels(job).set(self.sizer.size)

    def _keyset_batch(self, fence: int, pool: ThreadPoolExecutor | None) -> int | str:
        size = self.sizer.size
        fetch = min(size, self.job.fetch_size or size)
        self._pending_skips = frozenset()
        at: At = (self.cursor.next_id, self.cursor.key)
        with self.row.sessions.begin() as session:
            conn = session.connection(
                execution_options=snapshot_options(session.get_bind().dialect.name))
            rows = self._fetch(conn, at[0], fetch, **self._after_key(at))
            if not rows:  # nothing matches from the cursor to `hi`
                return self.row.finish(conn, fence, self.partition.hi + 1)
            to, done = self._process(session, conn, fence, rows, pool, at,
                                     check=not self.cursor.checked)
            short = len(rows) < fetch
            if not short and fetch < size:
                to, done, short = self._read_on(session, conn, fence, pool,
                                                (to, done, len(rows)), fetch, size)
            # A short read saw every matching row up to `hi`: the partition is done with
            # this batch, in its transaction.
            final = self.row.finish(conn, fence, self.partition.hi + 1) if short else None
        self._advance(to, done)
        return final if final is not None else to[0]

    def _after_key(self, at: At) -> dict[str, Any]:
        """The cursor key argument of a keyed job's read (none for an integer key)."""
        return {"after": at[1]} if self.job.keyed else {}

    def _past(self, rows: Sequence[Row[Any]], at: At) -> At:
        """The place after `rows`, read from `at`: past the last id, or (a keyed job) the
        rows counted and the last key read."""
        if self.job.keyed:
            return at[0] + len(rows), self.reads.key_at(rows, -1)
        return max(at[0], id_at(rows, -1, self.job.id_column) + 1), None

    def _read_on(self, session: Session, conn: Connection, fence: int,
                 pool: ThreadPoolExecutor | None, so_far: tuple[At, int, int],
                 fetch: int, size: int) -> tuple[At, int, bool]:
        """The rest of a batch bigger than the job's `fetch_size`: more reads of `fetch_size`
        rows, each processed as it is read (a few thousand rows at a time stay in the CPU's
        caches; tens of thousands at once do not), in the same transaction, up to `size` rows;
        then the checkpoint moves past them. Returns the checkpoint, the rows processed and
        whether a read came back short (the keyset pass reached `hi`)."""
        at, done, read = so_far
        short = False
        while read < size and not short:
            want = min(fetch, size - read)
            rows = self._fetch(conn, at[0], want, **self._after_key(at))
            short = len(rows) < want
            if rows:
                read += len(rows)
                done += self._apply(session, conn, fence, rows, pool,
                                    check=not self.cursor.checked)
                at = self._past(rows, at)
        self.row.move_on(conn, fence, at[0], read - so_far[2], self.job.keyset.encode(at[1]))
        return at, done, short

    def _fetch(self, conn: Connection, from_id: int, size: int, **after: Any) -> BatchRows:
        """The next `size` rows to do from `from_id` (a keyed job's: `after` its cursor
        key; a seam for the tests)."""
        return self.reads.fetch(conn, from_id, size, **after)

    def _process(self, session: Session, conn: Connection, fence: int,
                 rows: Sequence[Row[Any]], pool: ThreadPoolExecutor | None, at: At, *,
                 check: bool) -> tuple[At, int]:
        """Guard the work row, then run the job on `rows` (read from `at`), in the batch's
        transaction; return the new place and how many rows were processed (not skipped)."""
        to = self._past(rows, at)
        rate = (self.rows_done + len(rows)) / max(self.clock() - self.started, 1e-6)
        self.row.checkpoint(conn, fence, to[0], len(rows), rate, self.job.keyset.encode(to[1]))
        return to, self._apply(session, conn, fence, rows, pool, check=check)

    def _apply(self, session: Session, conn: Connection, fence: int,
               rows: Sequence[Row[Any]], pool: ThreadPoolExecutor | None, *,
               check: bool) -> int:
        """Run the job on `rows` (its skip policy too) and check its filter contract; return
        how many rows were processed. The work row's `rows_done` already counts every row."""
        id_column = self.job.id_column
        # One snapshot (PostgreSQL) or the write lock (SQLite) from the read on; an id span
        # needs integer ids.
        exact = exact_span(conn) and not self.job.keyed

        def run(chunk: Sequence[Row[Any]]) -> None:
            span = None
            if exact:
                first, last = id_at(chunk, 0, id_column), id_at(chunk, -1, id_column)
                span = (first, last) if self._clear_of_quarantine(first, last) else None
            self.job.process(chunk, Context(session, fence, self.job, self.partition, pool,
                                            span, self.params, self.run))

        skipped = (self.skips.process(session, rows, fence, run,
                                      pending=len(self._pending_skips)) if self.skips else [])
        if self.skips is None:
            run(rows)
        elif skipped:
            rows = [r for r in rows if int(getattr(r, id_column)) not in skipped]
            self.row.uncount(conn, fence, len(skipped))
        if check and rows and not self.job.visits_once:
            self._check_cleared(conn, rows)
            self.cursor.checked = True
        self._pending_skips |= frozenset(skipped)
        return len(rows)

    def _advance(self, to: At, rows: int) -> int:
        """After a batch committed: the cursor moves on (past the rows it quarantined)."""
        self.rows_done += rows
        checkpoint = self.cursor.next_id = to[0]
        self.cursor.key = to[1]
        if self.skips is not None and self._pending_skips:
            self.skips.quarantined |= self._pending_skips
            self._pending_skips = frozenset()
            self._leave_out()
        return checkpoint

    def _leave_out(self) -> None:
        """Reads leave out the partition's quarantined rows (they still match the filter)."""
        if self.skips is not None:
            self.reads.leave_out(self.skips.quarantined)

    def _clear_of_quarantine(self, first: int, last: int) -> bool:
        return not any(first <= q <= last for q in self.reads.left_out)

    def _check_cleared(self, conn: Connection, rows: Sequence[Row[Any]]) -> None:
        """The job's contract: a processed row no longer matches its filter (checked on the
        first batch of a run; a failure rolls the batch back).

        First the cheap test: no row of the batch's id range matches (one range scan). Only
        if one does (a row the batch left matching, a quarantined row, or a row committed
        into the range meanwhile) are the batch's own ids looked up, CHECK_CHUNK at a time."""
        job = self.job
        if job.keyed:
            self._check_keys_cleared(conn, rows)
            return
        first, last = id_at(rows, 0, job.id_column), id_at(rows, -1, job.id_column)
        if conn.execute(self._left_in_range, {"first": first, "last": last}).first() is None:
            return
        ids = ids_of(rows, job.id_column)
        left = None
        for at in range(0, len(ids), CHECK_CHUNK):
            left = conn.execute(self._left, {"ids": ids[at:at + CHECK_CHUNK]}).scalar()
            if left is not None:
                break
        if left is not None:
            raise FilterNotCleared(
                f"range job {job.name}: row {left} still matches the job's filter after it was "
                "processed (the process function must make processed rows stop matching "
                "`where`); nothing of this batch was written")

    def _check_keys_cleared(self, conn: Connection, rows: Sequence[Row[Any]]) -> None:
        """`_check_cleared` for a keyed job: no row of the batch's key range matches, else
        none of the batch's own keys does."""
        key, dialect = self.job.keyset, conn.dialect.name
        first, last = self.reads.key_at(rows, 0), self.reads.key_at(rows, -1)
        in_range = (select(*key.columns).where(
            key.at_least(dialect, key.literal(first)), key.at_most(dialect, key.literal(last)),
            self._where).limit(1))
        if conn.execute(in_range).first() is None:
            return
        keys = [self.reads.key_at(rows, i) for i in range(len(rows))]
        for at in range(0, len(keys), CHECK_CHUNK // len(key.columns)):
            chunk = keys[at:at + CHECK_CHUNK // len(key.columns)]
            among: ColumnElement[bool] = (key.columns[0].in_([k[0] for k in chunk])
                                          if len(key.columns) == 1
                                          else tuple_(*key.columns).in_(chunk))
            left = conn.execute(select(*key.columns).where(among, self._where).limit(1)).first()
            if left is not None:
                raise FilterNotCleared(
                    f"range job {self.job.name}: row with key {tuple(left)} still matches the "
                    "job's filter after it was processed (the process function must make "
                    "processed rows stop matching `where`); nothing of this batch was written")
