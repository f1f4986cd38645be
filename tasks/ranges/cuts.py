"""Partitions cut by row count: split points from an ordered walk of the key's index.

    count        SELECT count(*) FROM t                            rows n; p = round(n / size)
                                                                   partitions of s = ceil(n/p)
    each cut     SELECT key FROM t WHERE key > :last_cut           the key s rows on: the last
                 ORDER BY key LIMIT 1 OFFSET s - 1                 key of the next partition

Each step walks `s` entries of the key's index from the previous cut, so the whole walk reads
the index once (an index-only scan where the database has one), whatever the key type and the
shape of its values: a skewed or sparse id space gives partitions of equal row counts. Exact,
where a sample (TABLESAMPLE) would be approximate and PostgreSQL-only; at planning, once per
plan (docs/decisions.md, "Partitions cut by row count").

A keyed job's plan covers every key (tasks.ranges.planning.plan_keyed): rows inserted later
fall into the partition of their key, the last one for keys above the walk's last cut. An
integer key cut by rows gets the first plan from the walk and, as the table grows, partitions
of `partition_size` ids above it like any integer plan.
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select
from sqlalchemy.orm import Session

from tasks.ranges.jobkeys import KeyValue
from tasks.ranges.jobs import RangeJob
from tasks.ranges.planning import Partition, plan_by_rows, plan_keyed

__all__ = ["walk", "plan_first_by_rows", "probe"]


def walk(conn: Connection, job: RangeJob, size: int) -> tuple[list[KeyValue], int, int]:
    """The cuts of `job`'s table into partitions of about `size` rows: the last key of each
    partition but the last, the rows counted, and the rows per partition."""
    key = job.keyset
    rows = int(conn.execute(select(func.count()).select_from(job.table)).scalar_one())
    if rows == 0:
        return [], 0, 0
    parts = max(1, round(rows / size))
    step = -(-rows // parts)
    first = select(*key.columns).order_by(*key.columns).offset(step - 1).limit(1)
    after = first.where(key.above(conn.dialect.name, key.params()))
    cuts: list[KeyValue] = []
    for _ in range(parts - 1):
        found = (conn.execute(after, key.bind(cuts[-1])) if cuts else conn.execute(first)).first()
        if found is None:
            break
        cuts.append(tuple(found))
    return cuts, rows, step


def plan_first_by_rows(session: Session, job: RangeJob) -> list[Partition]:
    """The first plan of a job cut by rows (none for an empty table)."""
    conn = session.connection()
    cuts, rows, step = walk(conn, job, job.partition_size)
    if not job.keyset.integer:
        return plan_keyed(cuts, rows, step)
    if rows == 0:
        return []
    col = job.id_col
    lo, hi = conn.execute(select(select(func.min(col)).scalar_subquery(),
                                 select(func.max(col)).scalar_subquery())).one()
    if lo is None:
        return []
    return plan_by_rows(int(lo), int(hi), [int(c[0]) for c in cuts])


def probe(session: Session, job: RangeJob) -> None:
    """Read the first key in key order: raises what planning would raise if the table, a
    key column, or an ordering of its type is missing in the database."""
    key = job.keyset
    session.execute(select(*key.columns).order_by(*key.columns).limit(1)).first()
