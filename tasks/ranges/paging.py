"""The range partitions a page at a time, filtered: what `python -m tasks status` prints and the
console's job page shows, at any number of partitions (issue 20).

A `PartitionQuery` says which partitions (a job, states, an owner, or the slowest running ones)
and which page (`limit` rows after the cursor `after`); `partition_page` answers it with a
`PartitionPage`: at most `limit` views, how many match in all, and the cursors of the next and
previous pages. Its cost is bounded by the page, not by the partitions: a count, one read of
`limit + 1` rows and, for the previous page, one read of `limit + 1` keys.

Two orders, two cursors, both plain text that is passed back as `after`:

- by job and part (the default): a keyset cursor `JOB:PART`, the last partition shown. Job
  and part never change, so walking the pages lists every matching partition once even while
  partitions change state (one that changes into the filter behind the cursor is missed, one
  that leaves it is not shown, none is shown twice).
- slowest first (the lowest rows/s among running partitions): an offset, the number of
  partitions shown before. A rate changes at every batch, so a keyset on it would gain
  nothing over an offset, and on MariaDB a float column read back does not compare equal to
  what it stored (single precision).

An empty cursor (or none) is the first page; `prev` is None on the first page and `next` None
on the last.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement

from tasks.ranges.status import JobSummary, PartitionView, view_of
from tasks.ranges.tables import WORK, PartitionStatus
from tasks.ranges.workrow import every_partition

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "STATES", "InvalidPage", "PartitionQuery",
           "PartitionPage", "partition_page", "ranges_json"]

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# The states a listing filters on, in the order an operator reads them.
STATES = (PartitionStatus.RUNNING, PartitionStatus.PENDING, PartitionStatus.FAILED,
          PartitionStatus.PAUSED, PartitionStatus.DONE, PartitionStatus.EMPTY)
_KEY = re.compile(r"^([a-z][a-z0-9_]{0,63}):([0-9]{1,9})$")
_OFFSET = re.compile(r"^[0-9]{1,9}$")
_OWNER_MAX = 255


class InvalidPage(ValueError):
    """A filter or a cursor that names no page; the message is one line saying which value
    and what is accepted. Nothing was read."""


@dataclass(frozen=True)
class PartitionQuery:
    """Which partitions, and which page of them. Checked when made: `InvalidPage` otherwise."""

    job: str | None = None
    states: tuple[str, ...] = ()
    owner: str | None = None  # the owner starts with this (a worker's name: all its processes)
    slowest: bool = False  # running partitions only, lowest rows/s first
    limit: int = DEFAULT_LIMIT
    after: str = ""  # the cursor: JOB:PART, or an offset when `slowest`; "" the first page

    def __post_init__(self) -> None:
        unknown = [s for s in self.states if s not in STATES]
        if unknown:
            raise InvalidPage(f"unknown partition state {unknown[0][:32]!r} "
                              f"(known: {', '.join(STATES)})")
        if self.slowest and set(self.states) - {PartitionStatus.RUNNING}:
            raise InvalidPage("slowest lists running partitions: it takes no other state")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise InvalidPage(f"limit must be from 1 to {MAX_LIMIT}, not {self.limit}")
        if self.owner is not None and len(self.owner) > _OWNER_MAX:
            raise InvalidPage(f"owner must be at most {_OWNER_MAX} characters")
        self.after_key  # noqa: B018  (a cursor of the wrong form is refused here)

    @property
    def after_key(self) -> tuple[str, int] | None:
        """The cursor as (job, part) in the default order; None on the first page and when
        `slowest` (whose cursor is an offset)."""
        if not self.after:
            return None
        if self.slowest:
            if not _OFFSET.match(self.after):
                raise InvalidPage(f"after {self.after[:40]!r}: with slowest the cursor is the "
                                  "number of partitions already shown (the `next` of a page)")
            return None
        found = _KEY.match(self.after)
        if found is None:
            raise InvalidPage(f"after {self.after[:40]!r}: the cursor is JOB:PART, the last "
                              "partition of the page before (the `next` of a page)")
        return found.group(1), int(found.group(2))

    @classmethod
    def parse(cls, job: str | None = None, states: Sequence[str] = (), owner: str | None = None,
              slowest: bool | str = False, limit: str | int | None = None,
              after: str | None = None) -> PartitionQuery:
        """A query from text (the CLI's flags, the console's query string): `states` may
        hold comma-separated lists, `slowest` is a flag or 1/true/yes, an empty value is
        none."""
        wanted = tuple(dict.fromkeys(s.strip() for item in states for s in item.split(",")
                                     if s.strip()))
        if isinstance(slowest, str):
            if slowest.lower() not in ("", "0", "1", "false", "true", "no", "yes"):
                raise InvalidPage(f"slowest must be 1 or 0, not {slowest[:20]!r}")
            slowest = slowest.lower() in ("1", "true", "yes")
        return cls(job or None, wanted, owner or None, slowest, _limit(limit), after or "")

    @property
    def filtered(self) -> bool:
        """Whether the query leaves out partitions of its job(s) (a state, owner or slowest)."""
        return bool(self.states or self.owner or self.slowest)

    def where(self) -> ColumnElement[bool]:
        """The partitions the query matches, whatever the page."""
        w = WORK.c
        clauses = [every_partition()]
        if self.job is not None:
            clauses.append(w.job == self.job)
        if self.slowest:
            clauses.append(w.status == PartitionStatus.RUNNING)
        elif self.states:
            clauses.append(w.status.in_(self.states))
        if self.owner:
            clauses.append(w.owner.startswith(self.owner, autoescape=True))
        return and_(*clauses)

    def as_dict(self) -> dict[str, Any]:
        """The filter and the page asked for, as JSON-able values."""
        return {"job": self.job, "state": list(self.states), "owner": self.owner,
                "slowest": self.slowest, "limit": self.limit, "after": self.after or None,
                "order": "slowest" if self.slowest else "part"}


def _limit(value: str | int | None) -> int:
    if value is None or value == "":
        return DEFAULT_LIMIT
    if isinstance(value, int):
        return value
    if not re.fullmatch(r"[0-9]{1,9}", value.strip()):
        raise InvalidPage(f"limit must be a whole number from 1 to {MAX_LIMIT}, "
                          f"not {value[:20]!r}")
    return int(value)


@dataclass(frozen=True)
class PartitionPage:
    """One page of partitions: at most `query.limit` of them, `total` matching in all, and
    the `after` cursors of the next and previous pages (None: there is none; "": the first)."""

    query: PartitionQuery
    partitions: list[PartitionView]
    total: int
    next: str | None
    prev: str | None

    def as_dict(self) -> dict[str, Any]:
        """`status --json`'s `page` and the console's: the query, the total, the cursors."""
        return {**self.query.as_dict(), "total": self.total, "shown": len(self.partitions),
                "next": self.next, "prev": self.prev}


def partition_page(sessions: sessionmaker[Session], query: PartitionQuery) -> PartitionPage:
    """The page `query` asks for, read in one session (a count and one or two bounded
    reads)."""
    where = query.where()
    with sessions() as session:
        total = session.execute(select(func.count()).select_from(WORK).where(where)
                                ).scalar_one()
        if query.slowest:
            return _slowest(session, query, int(total))
        key = query.after_key
        listed = select(WORK).where(where)
        if key is not None:
            listed = listed.where(_beyond(*key))
        rows = session.execute(listed.order_by(WORK.c.job, WORK.c.part)
                               .limit(query.limit + 1)).all()
        prev = _prev_key(session, query, where, key) if key is not None else None
    shown = [view_of(r) for r in rows[:query.limit]]
    more = len(rows) > query.limit
    return PartitionPage(query, shown, int(total),
                         f"{shown[-1].job}:{shown[-1].part}" if more else None, prev)


def _beyond(job: str, part: int) -> ColumnElement[bool]:
    """Partitions after JOB:PART in the listing's order (job, then part)."""
    w = WORK.c
    return or_(w.job > job, and_(w.job == job, w.part > part))


def _prev_key(session: Session, query: PartitionQuery, where: ColumnElement[bool],
              key: tuple[str, int]) -> str | None:
    """The cursor of the page before the one after `key`: None when no partition comes
    before it, "" when the page before is the first, else the key `limit + 1` back."""
    w = WORK.c
    back = session.execute(select(w.job, w.part).where(where, ~_beyond(*key))
                           .order_by(w.job.desc(), w.part.desc())
                           .limit(query.limit + 1)).all()
    if not back:
        return None
    if len(back) <= query.limit:
        return ""
    job, part = back[query.limit]
    return f"{job}:{part}"


def _slowest(session: Session, query: PartitionQuery, total: int) -> PartitionPage:
    """A page of running partitions, lowest rows/s first (ties by job and part)."""
    w = WORK.c
    offset = int(query.after or 0)
    rows = session.execute(select(WORK).where(query.where())
                           .order_by(w.rate, w.job, w.part)
                           .offset(offset).limit(query.limit + 1)).all()
    shown = [view_of(r) for r in rows[:query.limit]]
    more = len(rows) > query.limit
    back = offset - query.limit
    prev = None if offset == 0 else str(back) if back > 0 else ""
    return PartitionPage(query, shown, total, str(offset + query.limit) if more else None,
                         prev)


def ranges_json(summaries: Sequence[JobSummary], page: PartitionPage) -> dict[str, Any]:
    """The `jobs`, `partitions` and `page` of `status --json`: every job's summary and totals
    per state, one page of partitions and how to get the next."""
    return {"jobs": [s.as_dict() for s in summaries],
            "partitions": [v.as_dict() for v in page.partitions], "page": page.as_dict()}
