"""Test-only range jobs with run parameters (issue 21; EXTRA_TASK_MODULES names this module).

`cm_sliced` walks the rows of `cm_data` whose id is `remainder` modulo `modulo` (its `where`
is a function of its parameters) and writes into each processed row's payload what its
process function found in `ctx.params`, so a test can read which run's parameters reached
which row. `cm_noted` keeps a static `where` and takes one optional parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, update

from examples.tables import CM_DATA
from tasks.ranges.jobs import Context, RangeJob, register

__all__ = ["Slice", "Note", "cm_sliced", "cm_noted", "payload_of"]

t = CM_DATA


@dataclass(frozen=True)
class Slice:
    """Which rows to walk (`id % modulo == remainder`), and what to write into them."""

    modulo: int
    remainder: int = 0
    label: str = "slice"
    ratio: float = 1.0
    loud: bool = False
    since: date | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.modulo < 1:
            raise ValueError(f"modulo must be at least 1, got {self.modulo}")


def payload_of(p: Slice) -> str:
    """What `cm_sliced` writes into a row it processed with parameters `p`."""
    return f"{p.label}:{p.modulo}/{p.remainder}:{p.since}:{p.loud}"


def _where(p: Slice) -> ColumnElement[bool]:
    return and_(t.c.status == 0, t.c.id % p.modulo == p.remainder)


def _mark(rows: Sequence[Row[Any]], ctx: Context) -> None:
    params = ctx.params
    assert isinstance(params, Slice), f"ctx.params is {params!r}"
    ctx.session.execute(update(t).where(ctx.in_batch(t.c.id, [r.id for r in rows])).values(
        status=1, processed_count=t.c.processed_count + 1, processed_fence=ctx.fence,
        payload=payload_of(params)))


cm_sliced = register(RangeJob(
    name="cm_sliced", table=t, where=_where, params=Slice, process=_mark,
    columns=("id",), partition_size=2000, batch_size=200))


@dataclass(frozen=True)
class Note:
    label: str | None = None


def _note(rows: Sequence[Row[Any]], ctx: Context) -> None:
    label = ctx.params.label or "-"
    ctx.session.execute(update(t).where(ctx.in_batch(t.c.id, [r.id for r in rows])).values(
        status=1, processed_count=t.c.processed_count + 1, payload=label))


cm_noted = register(RangeJob(
    name="cm_noted", table=t, where=t.c.status == 0, params=Note, process=_note,
    columns=("id",), partition_size=2000, batch_size=200))
