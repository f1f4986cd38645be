"""What a range job's process function gets besides its rows: `Context` (re-exported by
`tasks.ranges.jobs`, where jobs are declared)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Integer, Text, and_, any_, bindparam, cast
from sqlalchemy.orm import Session

from tasks.ranges.planning import Partition

__all__ = ["Context"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Context:
    """What a process function gets besides its rows.

    `session` is the batch's transaction; `fence` is the lease's fencing token (store it beside
    an effect to show which holder made it); `map` runs a function over the rows on the job's
    thread pool and returns the results in order.

    `in_batch(column, ids)` is `column IN ids` in the form the database runs fastest (an array
    parameter on PostgreSQL).

    `span` is `(first id, last id)` of the rows when they are *every* row of that id range that
    matches the job's filter, and a write by that range cannot touch another (SQLite: the
    batch holds the write lock from its read on; PostgreSQL: the batch reads and writes in one
    REPEATABLE READ snapshot); a job may then write by the id range
    (`id BETWEEN first AND last AND <filter>`) instead of by the list of ids. None otherwise
    (a skipped row lies in the range, MariaDB, whose UPDATE reads rows committed after the
    batch's read, or a keyed job, whose rows have no id range).

    `params` is the run's parameters, an instance of the job's `params` dataclass (None if the
    job declares none).

    `run` is the id of the run the partition belongs to; `idempotency_key(row)` is the key an
    effect outside the database carries so its receiver can drop a retried batch's repeats.
    """

    session: Session
    fence: int
    job: Any  # the RangeJob (tasks.ranges.jobs) whose batch this is: jobs imports this module
    partition: Partition
    pool: ThreadPoolExecutor | None = None
    span: tuple[int, int] | None = None
    params: Any = None
    run: int | None = None

    def idempotency_key(self, row: Any) -> str:
        """`JOB:RUN:KEY` for `row` (a row of the job's table, or its key itself): the same
        for every retry of the batch within this run (a holder that died, a takeover), a
        new one in the next run. A receiver that accepts each key once (`SET key NX`, a
        unique column) applies each row's effect once per run."""
        if self.run is None:
            raise RuntimeError(f"range job {self.job.name}: no run, so no idempotency key "
                               "(start the job: python -m tasks jobs start)")
        key = getattr(row, self.job.id_column, row)
        if isinstance(key, dict | list | set):
            raise TypeError(f"range job {self.job.name}: idempotency_key takes a row of the "
                            "job's table or a key (a collection's item: pass its key, "
                            "ctx.idempotency_key(item['id'])), not a "
                            f"{type(key).__name__}")
        return f"{self.job.name}:{self.run}:{key}"

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        if self.pool is None:
            return [fn(item) for item in items]
        return list(self.pool.map(fn, items))

    def in_batch(self, column: ColumnElement[Any], ids: Iterable[Any]) -> ColumnElement[bool]:
        """`column IN ids`, in the form this database runs fastest: one array parameter on
        PostgreSQL (`column = ANY(:ids)`, one plan whatever the count), an IN list elsewhere
        (under the driver's bind limit: SQLite 32,766 parameters, MySQL 65,535)."""
        values = list(ids)
        if self.session.get_bind().dialect.name != "postgresql":
            return column.in_(values)
        # Imported here: the PostgreSQL dialect takes ~30 ms to import, which every process
        # on another database (each CLI call, each worker) would otherwise pay.
        from sqlalchemy.dialects.postgresql import ARRAY

        if isinstance(column.type, Integer) and all(type(v) is int for v in values):
            # One text parameter, `{1,2,3}`, cast by the server: the driver would otherwise
            # dump the list element by element in Python (a regex test per id: half the
            # client's time on a batch of 2,000 ids).
            literal = "{" + ",".join(map(str, values)) + "}"
            listed = column == any_(cast(bindparam(None, literal, type_=Text),
                                         ARRAY(column.type)))
            # Bounded by the ids' range too: the server walks one index range and tests each
            # row against the (hashed) list, instead of one index probe per id.
            return and_(column.between(min(values), max(values)), listed) if values else listed
        return column == any_(bindparam(None, values, type_=ARRAY(column.type)))
