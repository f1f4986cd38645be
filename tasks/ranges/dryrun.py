"""A dry run of a range job (`python -m tasks jobs start JOB --dry-run`): what a start would
do, read without writing anything.

What it reads, on one read-only session that is rolled back (no run, no lease, no Redis, no
work row; nothing but SELECTs):

    the job's stored partitions and latest run     the plan a start would walk: the stored
                                                   one (a cancelled run's is planned anew)
                                                   plus partitions for ids beyond it
    the table's lowest and highest id              the bounds of a new plan
    COUNT(*) over sampled id windows               estimated rows to do, in total and for
                                                   each shown partition (exact when the
                                                   range is at most SAMPLE_IDS ids)
    the first row to do (ORDER BY id LIMIT 1)      which partition the first batch is in
    that batch's read, timed                       the SQL shown, the first rows, and the
                                                   reading rate the ETA comes from

The estimate counts the filter's rows in WINDOWS windows of ids spread evenly over the range
(SAMPLE_IDS ids in all) and scales by the range's span, so it costs the same on any table and
is exact on small ranges. It assumes rows are spread over the id space about as evenly as the
windows see them; a filter matching only a few narrow id clusters is estimated poorly.
The ETA is the estimated rows over one worker's reading rate: `process` is not run, so it is a
lower bound for one worker, not a forecast for the fleet.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Connection, Table, func, or_, select
from sqlalchemy.exc import CompileError
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.cuts import walk
from tasks.ranges.jobs import InvalidArguments, RangeJob
from tasks.ranges.planning import StoredPlan, plan_after, plan_keyed, plan_partitions
from tasks.ranges.reads import Reads
from tasks.ranges.tables import RANGE_RUNS, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import partitions_of

__all__ = ["DryRun", "Estimate", "dry_run", "estimate_rows", "SAMPLE_IDS", "WINDOWS",
           "SHOW_PARTITIONS", "SHOW_ROWS"]

SAMPLE_IDS = 20_000  # ids one estimate counts at most
WINDOWS = 20  # windows those ids are spread over
SHOW_PARTITIONS = 5  # partitions shown with their bounds and estimate
SHOW_ROWS = 5  # rows of the first batch shown


class Estimate(NamedTuple):
    rows: int
    exact: bool


class _Part(NamedTuple):
    part: int
    lo: int
    hi: int
    from_id: int  # where its keyset pass would begin


@dataclass
class DryRun:
    """What `start` would do: the plan, the first batch, and an ETA (`as_dict`: the JSON)."""

    job: str
    params: dict[str, Any] | None
    partitions_total: int
    partitions: list[dict[str, Any]]
    estimated_rows: int
    estimate_exact: bool
    sql: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    sample: dict[str, Any] = field(default_factory=dict)
    eta_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "dry_run": True, "params": self.params,
                "partitions_total": self.partitions_total, "partitions": self.partitions,
                "estimated_rows": self.estimated_rows, "estimate_exact": self.estimate_exact,
                "sql": self.sql, "rows": self.rows, "sample": self.sample, "eta_s": self.eta_s}


def estimate_rows(conn: Connection, table: Table, id_col: Any, where: ColumnElement[bool],
                  lo: int, hi: int, budget: int = SAMPLE_IDS,
                  windows: int = WINDOWS) -> Estimate:
    """Rows of `table` in ids `lo..hi` that match `where`: counted when the range spans at
    most `budget` ids, else counted in `windows` evenly spread windows and scaled."""
    if hi < lo:
        return Estimate(0, True)
    span = hi - lo + 1
    count = select(func.count()).select_from(table)
    if span <= budget:
        return Estimate(int(conn.execute(count.where(id_col.between(lo, hi), where))
                            .scalar_one()), True)
    windows = max(min(windows, budget), 1)
    width, stride = max(budget // windows, 1), span // windows
    starts = [lo + i * stride + (stride - width) // 2 for i in range(windows)]
    sampled = or_(*(id_col.between(a, a + width - 1) for a in starts))
    found = int(conn.execute(count.where(sampled, where)).scalar_one())
    return Estimate(round(found * span / (width * windows)), False)


def _plan(conn: Connection, job: RangeJob, lo: int | None, hi: int | None) -> list[_Part]:
    """The partitions a start would walk, in claim order (by number)."""
    latest = conn.execute(select(RANGE_RUNS.c.state).where(RANGE_RUNS.c.job == job.name)
                          .order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar()
    stored = [] if latest == RunState.CANCELLED else conn.execute(
        select(WORK.c.part, WORK.c.lo, WORK.c.hi, WORK.c.next_id, WORK.c.status)
        .where(partitions_of(job.name))).all()
    parts = [_Part(r.part, r.lo, r.hi, r.lo if r.status in (S.DONE, S.EMPTY) else r.next_id)
             for r in stored]
    before = (StoredPlan(min(p.lo for p in parts), max(p.hi for p in parts),
                         max(p.part for p in parts)) if parts else None)
    new = (plan_after(before, lo, hi, job.partition_size) if before is not None
           else plan_partitions(lo, hi, job.partition_size))
    parts += [_Part(p.part, p.lo, p.hi, p.lo) for p in new]
    return sorted(parts)


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, int | float | str | bool) else str(value)


def _sql(conn: Connection, statement: Any) -> str:
    """The statement as the database would run it, values inlined (for display only)."""
    try:
        return str(statement.compile(dialect=conn.dialect,
                                     compile_kwargs={"literal_binds": True}))
    except (CompileError, NotImplementedError, TypeError):
        return str(statement.compile(dialect=conn.dialect))


def _first_batch(conn: Connection, job: RangeJob, where: ColumnElement[bool],
                 parts: list[_Part], result: DryRun) -> None:
    """The SQL of the first batch of the first partition holding a row to do, its first
    rows, and the timed read the ETA comes from."""
    by_lo = sorted(parts, key=lambda p: p.lo)
    first = conn.execute(select(job.id_col).where(
        job.id_col.between(by_lo[0].lo, by_lo[-1].hi), where)
        .order_by(job.id_col).limit(1)).scalar()
    at = bisect.bisect_right([p.lo for p in by_lo], first) - 1 if first is not None else 0
    part = by_lo[max(at, 0)]
    reads = Reads(job, part.hi, where)
    result.sql = _sql(conn, reads.statement(part.from_id, job.batch_size))
    _timed_batch(conn, reads, part.part, part.from_id, job.batch_size, result)


def _timed_batch(conn: Connection, reads: Reads, part: int, from_id: int, size: int,
                 result: DryRun, after: Any = None) -> None:
    """The first batch's read, timed: its first rows, the reading rate and the ETA."""
    began = time.perf_counter()
    rows = reads.fetch(conn, from_id, size, after)
    seconds = max(time.perf_counter() - began, 1e-6)
    result.rows = [{k: _plain(v) for k, v in r._mapping.items()} for r in rows[:SHOW_ROWS]]
    rate = len(rows) / seconds
    result.sample = {"part": part, "rows": len(rows), "seconds": round(seconds, 6),
                     "rows_per_s": round(rate, 1)}
    result.eta_s = round(result.estimated_rows / rate, 3) if rows else None


def dry_run(sessions: sessionmaker[Session], job: RangeJob, params: Any,
            shown: dict[str, Any] | None) -> DryRun:
    """What starting `job` with `params` (checked: `RangeJob.make_params`) would do; `shown`
    is the parameters as stored (their JSON). Reads only, and rolls back. A collection job
    (`tasks.ranges.collections`) is refused: its items exist only once a run starts."""
    if job.input is not None or job.pages is not None:
        raise InvalidArguments(f"{job.name}: a dry run reads a table, and this job's items "
                               "come from its collection when a run starts")
    where = job.filter(params)
    with sessions() as session:
        conn = session.connection()
        if job.keyed:
            try:
                return _keyed_dry_run(conn, job, where, shown)
            finally:
                session.rollback()
        try:
            lo, hi = conn.execute(select(select(func.min(job.id_col)).scalar_subquery(),
                                         select(func.max(job.id_col)).scalar_subquery())).one()
            parts = _plan(conn, job, lo, hi)
            total = (estimate_rows(conn, job.table, job.id_col, where, lo, hi)
                     if lo is not None else Estimate(0, True))
            result = DryRun(job.name, shown, len(parts), [], total.rows, total.exact)
            for p in parts[:SHOW_PARTITIONS]:
                found = estimate_rows(conn, job.table, job.id_col, where,
                                      max(p.from_id, lo or 0), min(p.hi, hi or 0))
                result.partitions.append({"part": p.part, "lo": p.lo, "hi": p.hi,
                                          "from_id": p.from_id, "estimated_rows": found.rows,
                                          "exact": found.exact})
            if parts:
                _first_batch(conn, job, where, parts, result)
        finally:
            session.rollback()
    return result


def _keyed_dry_run(conn: Connection, job: RangeJob, where: ColumnElement[bool],
                   shown: dict[str, Any] | None) -> DryRun:
    """A keyed job's dry run (tasks.ranges.jobkeys): the stored plan, or the one the walk of
    the key's index would cut; rows to do estimated from the share of the first SAMPLE_IDS
    rows in key order that match the filter (exact on a table of at most that many rows);
    the first batch of the first open partition in key order."""
    key = job.keyset
    latest = conn.execute(select(RANGE_RUNS.c.state).where(RANGE_RUNS.c.job == job.name)
                          .order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar()
    stored = [] if latest == RunState.CANCELLED else conn.execute(
        select(WORK.c.part, WORK.c.lo, WORK.c.hi, WORK.c.lo_key, WORK.c.hi_key,
               WORK.c.next_id, WORK.c.next_key, WORK.c.status)
        .where(partitions_of(job.name)).order_by(WORK.c.part)).all()
    parts = [(p.part, p.lo, p.hi, key.decode(p.hi_key),
              key.decode(p.lo_key if p.status in (S.DONE, S.EMPTY) else p.next_key),
              p.next_id) for p in stored]
    if not stored:
        cuts, total, step = walk(conn, job, job.partition_size)
        parts = [(p.part, p.lo, p.hi, p.hi_key, p.lo_key, p.lo)
                 for p in plan_keyed(cuts, total, step)]
    rows = int(conn.execute(select(func.count()).select_from(job.table)).scalar_one())
    count = select(func.count()).select_from(job.table).where(where)
    edge = conn.execute(select(*key.columns).order_by(*key.columns)
                        .offset(SAMPLE_IDS - 1).limit(1)).first()
    if edge is None:
        estimate = Estimate(int(conn.execute(count).scalar_one()), True)
    else:
        matched = conn.execute(count.where(key.at_most(conn.dialect.name,
                                                       key.literal(tuple(edge))))).scalar_one()
        estimate = Estimate(round(int(matched) * rows / SAMPLE_IDS), False)
    share = estimate.rows / rows if rows else 0.0
    result = DryRun(job.name, shown, len(parts), [], estimate.rows, estimate.exact)
    for part, lo, hi, _hi_key, after, from_id in parts[:SHOW_PARTITIONS]:
        result.partitions.append({"part": part, "lo": lo, "hi": hi, "from_id": from_id,
                                  "lo_key": key.encode(after), "estimated_rows":
                                  round((hi - lo + 1) * share), "exact": False})
    if parts:
        part, _lo, hi, hi_key, after, from_id = parts[0]
        reads = Reads(job, hi, where, hi_key)
        result.sql = _sql(conn, reads.statement(from_id, job.batch_size, conn.dialect.name,
                                                after))
        _timed_batch(conn, reads, part, from_id, job.batch_size, result, after)
    return result
