"""Dead letters by filter: search them, count them, replay or purge every one a filter matches.

A filter is a kind (or every kind) and a search text matched, case-insensitively, anywhere in
a letter's ref or reason: a parameterized LIKE whose wildcards (`%`, `_`) and escape character
in the text are escaped, so "50%_off" finds those nine characters and nothing else.

A bulk action acts on what its operator confirmed, not on what arrives afterwards:

    preview   count the letters the filter matches now, and the highest id among them (`upto`)
    confirm   the operator reads "Replay 37 letters of kind task matching 'foo'?"
    act       the filter again, limited to ids <= upto: if the count is no longer the one
              confirmed (a letter purged or added below `upto` meanwhile) the action is refused
              (`FilterChanged`) and nothing is done; else the letters are walked in id order, in
              batches of BULK_BATCH, each replayed with the single-letter replay (claimed
              once: a letter replayed meanwhile is counted as already replayed) or deleted.

A letter written after the preview has a higher id than `upto`: no bulk action touches it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import ColumnElement, case, delete, func, or_, select, true
from sqlalchemy.orm import Session, sessionmaker

from tasks.config.settings import redact
from tasks.deadletters.store import (
    AlreadyReplayed,
    DeadLetterError,
    DeadLetters,
    LetterNotFound,
    Send,
    Summary,
)
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.store.db import affected

__all__ = ["LetterFilter", "Preview", "BulkReport", "FilterChanged", "BadFilter", "BULK_BATCH",
           "MAX_SEARCH", "escape_like", "preview", "matching", "reasons_of", "replay_matching",
           "purge_matching"]

BULK_BATCH = 100  # letters read (and replayed or deleted) per transaction of a bulk action
MAX_SEARCH = 200  # characters of a search text
_ESCAPE = "!"  # LIKE's escape character: not a backslash, which MySQL's literals also escape


class FilterChanged(Exception):
    """The letters a bulk action would touch are not the ones its operator confirmed."""


class BadFilter(ValueError):
    """A filter that cannot be asked (a search text too long)."""


def escape_like(text: str) -> str:
    """`text` as a LIKE pattern's literal part: its `%`, `_` and escape character escaped."""
    return "".join(_ESCAPE + c if c in ("%", "_", _ESCAPE) else c for c in text)


@dataclass(frozen=True)
class LetterFilter:
    """A kind (None: every kind) and a search text ('' matches every letter)."""

    kind: str | None = None
    search: str = ""

    def __post_init__(self) -> None:
        if len(self.search) > MAX_SEARCH:
            raise BadFilter(f"a search text is at most {MAX_SEARCH} characters")

    def where(self) -> ColumnElement[bool]:
        d = DEAD_LETTERS.c
        found: ColumnElement[bool] = true()
        if self.kind:
            found = found & (d.kind == self.kind)
        if self.search:
            pattern = f"%{escape_like(self.search.lower())}%"
            found = found & or_(func.lower(d.ref).like(pattern, escape=_ESCAPE),
                                func.lower(d.reason).like(pattern, escape=_ESCAPE))
        return found

    def described(self) -> str:
        """'letters of kind task matching 'foo'' as a confirmation names them."""
        kind = f" of kind {self.kind}" if self.kind else ""
        search = f" matching {self.search!r}" if self.search else ""
        return f"letters{kind}{search}"


@dataclass(frozen=True)
class Preview:
    """What a filter matches now: how many letters, how many not replayed yet, the highest
    id among them (0: none)."""

    count: int
    unreplayed: int
    upto: int

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "unreplayed": self.unreplayed, "upto": self.upto}


@dataclass
class BulkReport:
    """What a bulk action did: letters replayed (or purged), refused as not replayable,
    found already replayed, gone before their turn."""

    matched: int
    done: int = 0
    not_replayable: int = 0
    already_replayed: int = 0
    gone: int = 0
    stopped: str | None = None  # why a replay stopped before the end (its send failed)

    def as_dict(self) -> dict[str, int | str | None]:
        return {"matched": self.matched, "done": self.done,
                "not_replayable": self.not_replayable,
                "already_replayed": self.already_replayed, "gone": self.gone,
                "stopped": self.stopped}


def preview(sessions: sessionmaker[Session], found: LetterFilter,
            upto: int | None = None) -> Preview:
    """Count what `found` matches (among ids <= `upto`, if given), in one query."""
    d = DEAD_LETTERS.c
    where = found.where() if upto is None else found.where() & (d.id <= upto)
    # A CASE sum, not COUNT ... FILTER: MariaDB has no FILTER clause.
    query = select(func.count(), func.coalesce(func.max(d.id), 0),
                   func.sum(case((d.replayed_at.is_(None), 1), else_=0))).where(where)
    with sessions() as session:
        count, top, fresh = session.execute(query).one()
    return Preview(int(count), int(fresh or 0), int(top or 0))


def matching(sessions: sessionmaker[Session], found: LetterFilter,
             limit: int = 100) -> list[Summary]:
    """The newest `limit` letters `found` matches, without their payloads."""
    d = DEAD_LETTERS.c
    query = (select(d.id, d.kind, d.ref, d.reason, d.created_at, d.replayed_at,
                    d.replay_task_id).where(found.where()).order_by(d.id.desc()).limit(limit))
    with sessions() as session:
        rows = session.execute(query).all()
    return [Summary(r.id, r.kind, r.ref, r.reason, r.created_at, r.replayed_at,
                    r.replay_task_id) for r in rows]


def reasons_of(sessions: sessionmaker[Session], ids: list[int]) -> dict[int, str]:
    """The reason of each letter of `ids` that exists, by id (one query)."""
    if not ids:
        return {}
    d = DEAD_LETTERS.c
    with sessions() as session:
        return {int(i): str(r) for i, r in session.execute(
            select(d.id, d.reason).where(d.id.in_(ids))).all()}


def _confirmed(sessions: sessionmaker[Session], found: LetterFilter, upto: int,
               expected: int) -> int:
    """The count `found` matches up to `upto`; `FilterChanged` unless it is `expected`."""
    now = preview(sessions, found, upto).count
    if now != expected:
        raise FilterChanged(
            f"{expected} {found.described()} were confirmed, {now} match now (some were "
            "purged or replayed meanwhile); nothing was done: look again and confirm anew")
    return now


def _batches(sessions: sessionmaker[Session], found: LetterFilter,
             upto: int) -> Iterator[list[int]]:
    """The ids `found` matches up to `upto`, in id order, BULK_BATCH at a time (keyset)."""
    d = DEAD_LETTERS.c
    after = 0
    while True:
        with sessions() as session:
            ids = list(session.execute(select(d.id).where(
                found.where(), d.id > after, d.id <= upto).order_by(d.id)
                .limit(BULK_BATCH)).scalars())
        if not ids:
            return
        yield ids
        after = ids[-1]


def replay_matching(sessions: sessionmaker[Session], found: LetterFilter, upto: int,
                    expected: int, send: Send) -> BulkReport:
    """Replay every letter `found` matches up to `upto` (the preview's), each with
    `DeadLetters.replay` (at most once per letter), having checked that `expected` letters
    still match. A send that fails stops the walk (`BulkReport.stopped` says where and why):
    the letters before it were replayed, it and the rest are unchanged."""
    report = BulkReport(_confirmed(sessions, found, upto, expected))
    store = DeadLetters(sessions)
    for ids in _batches(sessions, found, upto):
        for letter_id in ids:
            try:
                store.replay(letter_id, send)
            except DeadLetterError as exc:
                _count_refusal(report, exc)
            except Exception as exc:  # the broker is away: the store took its claim back
                reason = redact(" ".join(str(exc).split()))[:300]
                report.stopped = f"letter {letter_id}: {type(exc).__name__}: {reason}"
                return report
            else:
                report.done += 1
    return report


def _count_refusal(report: BulkReport, exc: DeadLetterError) -> None:
    """A letter the single-letter replay refused, counted by why."""
    if isinstance(exc, AlreadyReplayed):
        report.already_replayed += 1
    elif isinstance(exc, LetterNotFound):
        report.gone += 1
    else:
        report.not_replayable += 1


def purge_matching(sessions: sessionmaker[Session], found: LetterFilter, upto: int,
                   expected: int) -> BulkReport:
    """Delete every letter `found` matches up to `upto`, BULK_BATCH per transaction, having
    checked that `expected` letters still match."""
    report = BulkReport(_confirmed(sessions, found, upto, expected))
    d = DEAD_LETTERS.c
    for ids in _batches(sessions, found, upto):
        with sessions.begin() as session:
            # The filter again in the DELETE: a letter changed since its batch was read
            # (its reason cannot change, but keep the delete exactly to what matches).
            gone = session.execute(delete(DEAD_LETTERS).where(d.id.in_(ids), found.where()))
        report.done += affected(gone)
    report.gone = report.matched - report.done
    return report
