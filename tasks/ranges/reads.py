"""The reads of one run of a partition: its rows from an id up to `hi` that match the job's
filter, in id order, its quarantined rows left out. A keyed job's (tasks.ranges.jobkeys): its
rows after a cursor key up to `hi_key`, in key order.

Rows come off the driver's cursor as plain tuples (`BatchRows`) when the job's columns need no
conversion on the dialect; SQLAlchemy `Row`s are made only if the job looks at its rows. The
runner itself needs only each row's id (`id_at`, `ids_of`). The keyset pass that walks these
reads, and decides when a partition is done, is `tasks.ranges.batches`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from sqlalchemy import ColumnElement, Connection, Dialect, Integer, Row, Select, bindparam, select
from sqlalchemy.engine import result_tuple
from sqlalchemy.exc import SQLAlchemyError

from tasks.ranges.jobkeys import KeyValue
from tasks.ranges.jobs import RangeJob

__all__ = ["Reads", "BatchRows", "Built", "built", "id_at", "ids_of", "plain"]


class BatchRows(Sequence[Row[Any]]):
    """One batch's rows as the driver returned them, made SQLAlchemy `Row`s on first access.

    `raw` holds the driver's tuples in the order of the read's columns, or `Row`s already
    (`make` None: a column needed a type conversion, so the read went through SQLAlchemy).
    The runner reads only ids (`id_at`, `ids`); a job that writes by `Context.span` may never
    touch its rows, and then no `Row` is built: for a batch of 20,000 rows that saves the
    objects and the garbage collector's walks over them (plain tuples of ints and strings
    drop out of its tracking).
    """

    __slots__ = ("_raw", "_make", "_id", "_rows")

    def __init__(self, raw: Sequence[Any], make: Callable[[Any], Row[Any]] | None,
                 id_index: int) -> None:
        self._raw, self._make, self._id = raw, make, id_index
        self._rows: Sequence[Row[Any]] | None = None if make is not None else raw

    def id_at(self, index: int) -> int:
        return int(self._raw[index][self._id])

    def values_at(self, index: int, positions: Sequence[int]) -> tuple[Any, ...]:
        """The values at `positions` of row `index` (a keyed job's key)."""
        row = self._raw[index]
        return tuple(row[p] for p in positions)

    def ids(self) -> list[int]:
        i = self._id
        return [int(r[i]) for r in self._raw]

    def rows(self) -> Sequence[Row[Any]]:
        if self._rows is None:
            assert self._make is not None
            self._rows = list(map(self._make, self._raw))
        return self._rows

    def __len__(self) -> int:
        return len(self._raw)

    @overload
    def __getitem__(self, index: int) -> Row[Any]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Row[Any]]: ...

    def __getitem__(self, index: int | slice) -> Row[Any] | Sequence[Row[Any]]:
        return self.rows()[index]

    def __iter__(self) -> Iterator[Row[Any]]:
        return iter(self.rows())


def id_at(rows: Sequence[Row[Any]], index: int, id_column: str) -> int:
    """The id of `rows[index]`, without making a `Row` of a driver's tuple."""
    if isinstance(rows, BatchRows):
        return rows.id_at(index)
    return int(getattr(rows[index], id_column))


def ids_of(rows: Sequence[Row[Any]], id_column: str) -> list[int]:
    """The ids of `rows`, without making `Row`s of a driver's tuples."""
    if isinstance(rows, BatchRows):
        return rows.ids()
    return [int(getattr(r, id_column)) for r in rows]


def plain(columns: Sequence[Any], dialect: Dialect) -> bool:
    """Whether the driver's values of `columns` are what SQLAlchemy would return (no result
    processor on this dialect: integers and strings on the three databases)."""
    for column in columns:
        try:
            impl = column.type.dialect_impl(dialect)
            if impl.result_processor(dialect, None) is not None:
                return False
        except (SQLAlchemyError, TypeError, ValueError, KeyError):
            return False
    return True


@dataclass(frozen=True)
class Built:
    """The statements of a job's partition runs for one filter (`where`), built once: a
    runner takes one partition after another, and building them cost each run about as much
    as its first batch of a thousand rows. The partition's bounds are bound per call."""

    where: ColumnElement[bool]
    columns: list[Any]
    make_row: Callable[[Any], Row[Any]]
    read: Select[Any]  # the rows matching `where` in :from_id..:hi, in id order, :size of them
    left_in_range: Select[Any]  # a row of :first..:last that still matches `where`
    left: Select[Any]  # a row among :ids that still matches `where`


# One entry a job (by job object, as `sizing.SETTLED`): the statements of its last filter. A
# filter made from a run's parameters is a new clause each run, so it is built anew, once.
_BUILT: dict[int, tuple[weakref.ref[RangeJob], Built]] = {}


def built(job: RangeJob, where: ColumnElement[bool]) -> Built:
    """`job`'s statements for `where`, built on the first call with this filter."""
    found = _BUILT.get(id(job))
    if found is not None and found[0]() is job and found[1].where is where:
        return found[1]
    columns = [job.table.c[c] for c in job.columns] if job.columns else list(job.table.c)
    between = job.id_col.between(bindparam("first"), bindparam("last"))
    made = Built(
        where, columns, result_tuple([c.key for c in columns], [(c,) for c in columns]),
        read=(select(*columns)
              .where(job.id_col >= bindparam("from_id"), job.id_col <= bindparam("hi"), where)
              .order_by(job.id_col).limit(bindparam("size", type_=Integer))),
        left_in_range=select(job.id_col).where(between, where).limit(1),
        left=(select(job.id_col).where(job.id_col.in_(bindparam("ids", expanding=True)), where)
              .limit(1)))
    _BUILT[id(job)] = (weakref.ref(job), made)
    return made


class Reads:
    """The reads of `job`'s rows up to `hi`: `fetch(conn, from_id, size)` returns the next
    `size` rows that match `where` (the job's filter for the run's parameters) from
    `from_id`, in id order, leaving out the ids given to `leave_out` (the partition's
    quarantined rows; they still match the filter).

    A keyed job's reads go by key instead (`hi_key` the partition's upper bound, None: none):
    `fetch(conn, from_id, size, after=cursor)` returns the next rows whose key is above
    `cursor` (None: from the first), `from_id` unused."""

    def __init__(self, job: RangeJob, hi: int, where: ColumnElement[bool],
                 hi_key: KeyValue | None = None) -> None:
        statements = built(job, where)
        columns = statements.columns
        self.job, self.hi = job, hi
        self._columns = columns
        names = [c.key for c in columns]
        self._id_index = names.index(job.id_column)
        self._key_index = [names.index(n) for n in job.keyset.names]
        self._make_row = statements.make_row
        self._raw_ok: bool | None = None  # the columns need no conversion (first read says)
        self._where, self._hi_key = where, hi_key
        self._keyed: dict[tuple[str, bool], Select[Any]] = {}
        self._query = statements.read
        self._read = self._query
        self._left_out: frozenset[int] = frozenset()

    @property
    def left_out(self) -> frozenset[int]:
        """The ids the reads leave out."""
        return self._left_out

    def leave_out(self, ids: frozenset[int]) -> None:
        """From now on the reads leave out `ids` (they replace the ids left out before)."""
        if ids == self._left_out:
            return
        self._left_out = ids
        self._read = self._query.where(self.job.id_col.not_in(sorted(ids)))

    def key_at(self, rows: Sequence[Row[Any]], index: int) -> KeyValue:
        """The key of `rows[index]` (a keyed job's cursor after it)."""
        if isinstance(rows, BatchRows):
            return rows.values_at(index, self._key_index)
        return self.job.keyset.of_row(rows[index])

    def _keyed_read(self, dialect: str, after: bool) -> Select[Any]:
        """A keyed job's read on `dialect`: rows above the cursor `k0, k1, ...` (`after`) or
        from the first, up to `hi_key`, in key order."""
        found = self._keyed.get((dialect, after))
        if found is None:
            key = self.job.keyset
            query = select(*self._columns).where(self._where)
            if self._hi_key is not None:
                query = query.where(key.at_most(dialect, key.literal(self._hi_key)))
            if after:
                query = query.where(key.above(dialect, key.params()))
            found = self._keyed[(dialect, after)] = (
                query.order_by(*key.columns).limit(bindparam("size", type_=Integer)))
        return found

    def statement(self, from_id: int, size: int, dialect: str = "",
                  after: KeyValue | None = None) -> Select[Any]:
        """The read `fetch(conn, from_id, size)` runs, its values bound (a dry run shows it)."""
        if self.job.keyed:
            read = self._keyed_read(dialect, after is not None)
            values = self.job.keyset.bind(after) if after is not None else {}
            return read.params(size=size, **values)
        return self._read.params(from_id=from_id, hi=self.hi, size=size)

    def fetch(self, conn: Connection, from_id: int, size: int,
              after: KeyValue | None = None) -> BatchRows:
        """The next `size` rows to do from `from_id` (a keyed job's: after the key `after`),
        off the driver's cursor when plain."""
        if self._raw_ok is None:
            self._raw_ok = plain(self._columns, conn.dialect)
        if self.job.keyed:
            read = self._keyed_read(conn.dialect.name, after is not None)
            values = self.job.keyset.bind(after) if after is not None else {}
            result = conn.execute(read, {"size": size, **values})
        else:
            result = conn.execute(self._read, {"from_id": from_id, "hi": self.hi, "size": size})
        if not self._raw_ok or result.cursor is None:
            return BatchRows(result.all(), None, self._id_index)
        try:
            raw = result.cursor.fetchall()
        finally:
            result.close()
        return BatchRows(raw, self._make_row, self._id_index)
