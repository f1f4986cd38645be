"""Skip policy for bad rows (Spring Batch's `skip`/`skipLimit`).

A job that declares `skip_on` (exception types) runs each batch's process function inside a
savepoint. When it raises one of those, the savepoint rolls back and the batch is bisected:
each half runs in its own savepoint, a half that raises is halved again, down to single rows.
What succeeds stays in the batch's transaction; each row that raises on its own is
quarantined, in that same transaction, as a dead letter of kind `SKIP_KIND` (job, partition,
row id, reason), so the batch, its checkpoint and its quarantine commit together or not at all.

    rows 1..8, row 6 raises    [1..8] fails -> [1..4] ok, [5..8] fails -> [5,6] fails
                               -> [5] ok, [6] fails: quarantined; [7,8] ok
                               the batch commits rows 1-5, 7, 8 and the letter for row 6

A quarantined row still matches the job's filter (it was never processed), so every read of
rows still to do (the keyset pass, the run's closing round) leaves out the partition's
quarantined ids: otherwise the closing round would reopen its partition forever. The dead
letters are the record (each names the run that quarantined its row): a row stays
quarantined until its letter is replayed (`python -m tasks deadletters replay ID`, or
`python -m tasks jobs retry-skipped JOB` for every row of the latest run: `tasks.ranges.retries`)
or purged (`python -m tasks deadletters purge ID`, after which the next run takes it again). A
partition tolerates `skip_limit` quarantined rows (counted from its letters); the batch that
would pass the limit rolls back and the partition fails as any failing batch does.

Each processed chunk is contiguous in the batch, so the rows it holds are still every row of
its own id range that matches the filter: its `Context.span` stays exact for a job that writes
by id range (cm_data), and never covers a quarantined row.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Row, insert, select
from sqlalchemy.orm import Session

from tasks.deadletters.tables import DEAD_LETTERS
from tasks.ranges.tables import RANGE_RUNS
from tasks.store.db import utcnow

__all__ = ["SKIP_KIND", "SkipLimitExceeded", "Skips", "validate_skips", "quarantined_ids",
           "quarantined_of_job"]

log = logging.getLogger("tasks.ranges")

SKIP_KIND = "range-skip"  # dead letters of rows a skip policy quarantined

# Runs the job's process function on some of the batch's rows (with their span, if exact).
RunChunk = Callable[[Sequence[Row[Any]]], None]


class SkipLimitExceeded(Exception):
    """A partition met more bad rows than its job's `skip_limit`: the partition fails."""


def validate_skips(job: str, skip_on: object, skip_limit: object) -> None:
    """ValueError naming the field when a job's skip policy is declared wrong."""
    if not isinstance(skip_on, tuple) or not all(
            isinstance(t, type) and issubclass(t, Exception) for t in skip_on):
        raise ValueError(f"range job {job}: skip_on must be a tuple of Exception subclasses, "
                         f"got {skip_on!r}")
    if not isinstance(skip_limit, int) or isinstance(skip_limit, bool) or skip_limit < 0:
        raise ValueError(f"range job {job}: skip_limit must be an integer >= 0, "
                         f"got {skip_limit!r}")
    if skip_limit and not skip_on:
        raise ValueError(f"range job {job}: skip_limit without skip_on skips nothing; "
                         "name the exceptions that skip a row in skip_on")


def _ref_prefix(job: str, part: int) -> str:
    return f"{job}:{part}:"


def quarantined_ids(session: Session, job: str, part: int) -> frozenset[int]:
    """The row ids of `job`'s partition `part` that its skip policy quarantined (a replayed
    letter's row is no longer quarantined)."""
    prefix = _ref_prefix(job, part)
    refs = session.execute(select(DEAD_LETTERS.c.ref).where(
        DEAD_LETTERS.c.kind == SKIP_KIND, DEAD_LETTERS.c.replayed_at.is_(None),
        DEAD_LETTERS.c.ref.startswith(prefix, autoescape=True)
    )).scalars()
    return frozenset(int(ref[len(prefix):]) for ref in refs)


def quarantined_of_job(session: Session, job: str) -> frozenset[int]:
    """The row ids of every partition of `job` that its skip policy quarantined."""
    prefix = f"{job}:"
    refs = session.execute(select(DEAD_LETTERS.c.ref).where(
        DEAD_LETTERS.c.kind == SKIP_KIND, DEAD_LETTERS.c.replayed_at.is_(None),
        DEAD_LETTERS.c.ref.startswith(prefix, autoescape=True)
    )).scalars()
    return frozenset(int(ref.rsplit(":", 1)[1]) for ref in refs)


class Skips:
    """The skip policy of one partition run: `process` runs a batch, quarantining bad rows.

    `job` is the RangeJob; `quarantined` the ids already quarantined in this partition (kept
    up to date by the caller after each commit).
    """

    def __init__(self, job: Any, part: int, quarantined: frozenset[int]) -> None:
        self.job, self.part = job, part
        self.quarantined = quarantined
        self._run: int | None = None  # the id of the run the letters name, read once

    def process(self, session: Session, rows: Sequence[Row[Any]], fence: int,
                run: RunChunk, *, pending: int = 0) -> list[int]:
        """Run the batch, bisecting around rows that raise a `skip_on` exception; quarantine
        them in `session`'s transaction and return their ids. `SkipLimitExceeded` (nothing of
        the batch is kept: the caller's transaction rolls back) past the job's limit, counting
        the `pending` rows earlier reads of the same batch quarantined."""
        bad = self._bisect(session, rows, run)
        if not bad:
            return []
        total = len(self.quarantined) + pending + len(bad)
        if total > self.job.skip_limit:
            first_id, first_exc = bad[0]
            raise SkipLimitExceeded(
                f"range job {self.job.name} partition {self.part}: {total} bad rows, past "
                f"skip_limit={self.job.skip_limit} (row {first_id}: {_reason(first_exc)})")
        for row_id, exc in bad:
            self._quarantine(session, row_id, exc, fence)
        return [row_id for row_id, _ in bad]

    def _bisect(self, session: Session, rows: Sequence[Row[Any]],
                run: RunChunk) -> list[tuple[int, Exception]]:
        """Chunks left to right; a chunk that raises is rolled back and halved."""
        bad: list[tuple[int, Exception]] = []
        todo: list[Sequence[Row[Any]]] = [rows]
        while todo:
            chunk = todo.pop()
            try:
                with session.begin_nested():
                    run(chunk)
            except self.job.skip_on as exc:
                if len(chunk) == 1:
                    bad.append((int(getattr(chunk[0], self.job.id_column)), exc))
                else:
                    mid = len(chunk) // 2
                    todo += [chunk[mid:], chunk[:mid]]  # the left half runs first
        return bad

    def _quarantine(self, session: Session, row_id: int, exc: Exception, fence: int) -> None:
        reason = _reason(exc)
        if self._run is None:
            # The job's latest run: the holder's own (a newer run opens only once every
            # partition finished, or after a re-plan that fences this holder out).
            self._run = session.execute(select(RANGE_RUNS.c.id).where(
                RANGE_RUNS.c.job == self.job.name).order_by(RANGE_RUNS.c.id.desc())
                .limit(1)).scalar() or 0
        payload = {"job": self.job.name, "part": self.part, "row_id": row_id,
                   "reason": reason, "fence": fence, "run": self._run}
        session.execute(insert(DEAD_LETTERS).values(
            kind=SKIP_KIND, ref=f"{_ref_prefix(self.job.name, self.part)}{row_id}",
            reason=reason, payload=json.dumps(payload, sort_keys=True), created_at=utcnow()))
        log.warning("range %s part %s: row %s skipped and quarantined (%s)", self.job.name,
                    self.part, row_id, reason)


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]

