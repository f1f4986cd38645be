"""A range job's key: the ordered, unique columns its partitions and batches walk.

    RangeJob(..., id_column="id")                   one integer column: id-span partitions,
                                                    the checkpoint an id (`next_id`)
    RangeJob(..., id_column="uid")                  a UUID (or string, date, timestamp)
    RangeJob(..., key=("created_at", "id"))         a composite key, compared as a tuple

A job whose key is one integer column keeps the integer path (`integer` True): partitions are
id ranges `lo..hi` and batches read `id >= :next_id`. Any other key is *keyed*: partitions are
cut by row count from a walk of the key's index (`tasks.ranges.cuts`), a partition covers the
keys `lo < key <= hi` (the first has no `lo`, the last no `hi`, so every key that can ever
exist lies in exactly one partition), and batches page by keyset: `WHERE key > :cursor ORDER BY
key LIMIT n`, a tuple comparison for a composite key. Bounds and the cursor are stored as data,
JSON text (`encode`/`decode`: a list of one value per column).

Every comparison happens in the database, in its own collation and ordering; nothing here
orders keys in Python (a string's order is the database's, not Python's).

The key must be unique (a keyset pass skips a row whose key repeats across a batch boundary)
and never NULL (a NULL key compares to nothing): `check` refuses a key that is neither covered
by a primary key or unique constraint of the table nor declared NOT NULL, and a column type
the databases cannot order or store as a cursor (floats, booleans, JSON, binary, ...).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Date,
    DateTime,
    Enum,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
    Uuid,
    and_,
    bindparam,
    or_,
    tuple_,
)
from sqlalchemy.sql.elements import BindParameter

__all__ = ["KeyValue", "JobKey", "key_of_job", "KEY_TYPES"]

KeyValue = tuple[Any, ...]
# What a key column may be, as the error says it (SQLAlchemy type classes, subclasses too).
KEY_TYPES = "integer, string, UUID, date or datetime"
# Dialects whose optimizer answers `(a, b) > (x, y)` from an index on (a, b); MariaDB and
# MySQL get the expanded form `a >= x AND (a > x OR b > y)` instead.
_ROW_VALUES = ("postgresql", "sqlite")


def _kind(column: Column[Any]) -> str | None:
    """How a column's values are stored in a cursor; None if it cannot be a key column."""
    t = column.type
    if isinstance(t, Integer):
        return "int"
    if isinstance(t, Uuid):
        return "uuid" if t.as_uuid else "str"
    if isinstance(t, DateTime):
        return "datetime"
    if isinstance(t, Date):
        return "date"
    if isinstance(t, String) and not isinstance(t, Enum):
        return "str"
    return None


def _encode(kind: str, value: Any) -> Any:
    if kind in ("uuid", "datetime", "date"):
        return str(value) if kind == "uuid" else value.isoformat()
    return value


def _decode(kind: str, value: Any) -> Any:
    if kind == "uuid":
        return uuid.UUID(value)
    if kind == "datetime":
        return datetime.fromisoformat(value)
    if kind == "date":
        return date.fromisoformat(value)
    return value


def _unique_sets(table: Table) -> list[set[str]]:
    """The column sets the table's metadata declares unique (primary key, unique
    constraints and unique indexes)."""
    sets = [{c.name for c in table.primary_key.columns}]
    sets += [{c.name for c in k.columns} for k in table.constraints
             if isinstance(k, UniqueConstraint)]
    sets += [{c.name for c in i.columns} for i in table.indexes
             if isinstance(i, Index) and i.unique]
    sets += [{c.name} for c in table.columns if c.unique]
    return [s for s in sets if s]


@dataclass(frozen=True)
class JobKey:
    """The key columns of a job's table, in key order, and how their values are stored."""

    columns: tuple[Column[Any], ...]
    kinds: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.columns)

    @property
    def integer(self) -> bool:
        """One integer column: the id-span path (lo, hi and next_id are ids)."""
        return self.kinds == ("int",)

    def encode(self, value: Sequence[Any] | None) -> str | None:
        """A key value as stored (JSON text; None stays None: no bound)."""
        if value is None:
            return None
        return json.dumps([_encode(k, v) for k, v in zip(self.kinds, value, strict=True)])

    def decode(self, text: str | None) -> KeyValue | None:
        """A stored key value back as the column values (None: no bound)."""
        if text is None:
            return None
        return tuple(_decode(k, v) for k, v in zip(self.kinds, json.loads(text), strict=True))

    def params(self) -> list[BindParameter[Any]]:
        """Bind parameters `k0, k1, ...` for a cursor, typed as the key's columns."""
        return [bindparam(f"k{i}", type_=c.type) for i, c in enumerate(self.columns)]

    def bind(self, value: Sequence[Any]) -> dict[str, Any]:
        """The values of `params()` for the cursor `value`."""
        return {f"k{i}": v for i, v in enumerate(value)}

    def literal(self, value: Sequence[Any]) -> list[BindParameter[Any]]:
        """`value` as bound values typed as the key's columns."""
        return [bindparam(None, v, type_=c.type) for v, c in zip(value, self.columns,
                                                                  strict=True)]

    def above(self, dialect: str, value: Sequence[Any]) -> ColumnElement[bool]:
        """`key > value` (value: bound values or bind parameters)."""
        return self._compare(dialect, list(value), strict=True, greater=True)

    def at_most(self, dialect: str, value: Sequence[Any]) -> ColumnElement[bool]:
        """`key <= value`."""
        return self._compare(dialect, list(value), strict=False, greater=False)

    def at_least(self, dialect: str, value: Sequence[Any]) -> ColumnElement[bool]:
        """`key >= value`."""
        return self._compare(dialect, list(value), strict=False, greater=True)

    def _compare(self, dialect: str, value: list[Any], *, strict: bool,
                 greater: bool) -> ColumnElement[bool]:
        cols = list(self.columns)
        if len(cols) == 1:
            c, v = cols[0], value[0]
            return (c > v if strict else c >= v) if greater else (c < v if strict else c <= v)
        if dialect in _ROW_VALUES:
            left, right = tuple_(*cols), tuple_(*value)
            if greater:
                return left > right if strict else left >= right
            return left < right if strict else left <= right
        return and_(cols[0] >= value[0] if greater else cols[0] <= value[0],
                    _expanded(cols, value, strict=strict, greater=greater))

    def of_row(self, row: Any) -> KeyValue:
        """The key of a SQLAlchemy row (by attribute)."""
        return tuple(getattr(row, name) for name in self.names)


def _expanded(cols: list[Any], value: list[Any], *, strict: bool,
              greater: bool) -> ColumnElement[bool]:
    """The lexicographic comparison of `cols` with `value` without row values:
    `c0 > v0 OR (c0 = v0 AND <the rest>)` (the last column strict or not)."""
    c, v = cols[0], value[0]
    if len(cols) == 1:
        return (c > v if strict else c >= v) if greater else (c < v if strict else c <= v)
    first = c > v if greater else c < v
    return or_(first, and_(c == v, _expanded(cols[1:], value[1:], strict=strict,
                                             greater=greater)))


def key_of_job(job_name: str, table: Table, names: tuple[str, ...],
               scoped: frozenset[str] = frozenset()) -> JobKey:
    """The key `names` of `table`; ValueError (one line, naming the job) if it cannot be a
    key: a missing column, a type the databases cannot order as a cursor, a nullable
    column, or columns no unique constraint covers. `scoped`: columns every read of the job
    fixes by equality (a CSV job's `run`), which count as part of the key for uniqueness."""
    if not names:
        raise ValueError(f"range job {job_name}: the key needs at least one column")
    if len(set(names)) != len(names):
        raise ValueError(f"range job {job_name}: key {names} repeats a column")
    for name in names:
        if name not in table.c:
            raise ValueError(f"range job {job_name}: table {table.name} has no column "
                             f"{name!r} (the key)")
    columns = tuple(table.c[name] for name in names)
    kinds = []
    for column in columns:
        kind = _kind(column)
        if kind is None:
            raise ValueError(f"range job {job_name}: key column {column.key!r} of table "
                             f"{table.name} is {column.type}, which cannot be a range key "
                             f"(one of: {KEY_TYPES})")
        if column.nullable:
            raise ValueError(f"range job {job_name}: key column {column.key!r} of table "
                             f"{table.name} is nullable; a NULL key is never read, so "
                             "declare it nullable=False")
        kinds.append(kind)
    if not any(unique <= set(names) | scoped for unique in _unique_sets(table)):
        raise ValueError(f"range job {job_name}: key {', '.join(names)} of table "
                         f"{table.name} is not unique in its metadata; declare a primary key, "
                         "unique constraint or unique index over (a subset of) its columns")
    return JobKey(columns, tuple(kinds))
