"""`python -m tasks status`, the core's part: dead letters of every kind, and the console every
CLI table is printed on. The wings render their own state (`tasks.ranges.status`,
`tasks.restock.status`); `tasks.cli.core` puts the three together."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletters.store import DeadLetters, Summary
from tasks.worker.limits import OVERSIZED_KIND

__all__ = ["render_letters", "quote_text", "RECENT_LETTERS", "LettersView", "letters_view",
           "letters_renderable", "letters_json", "console_for", "PIPED_WIDTH", "SHOW_LIMIT",
           "SEND_RETRY", "REPLAY_HINTS", "with_hint"]

# Dead letters `status` lists (newest first, without payloads); the rest are only counted.
RECENT_LETTERS = 10

# Characters of a payload `deadletters show` and the console print; the rest is counted, not
# shown.
SHOW_LIMIT = 4000

# How a replay's publish retries when the broker is away (then the replay is refused).
SEND_RETRY = {"max_retries": 2, "interval_start": 0.0, "interval_step": 0.5,
              "interval_max": 1.0}

# What to do instead of a replay, per kind of letter that keeps no task to send. Keyed by the
# kinds' values (the wings' DEAD_LETTER_KIND constants, tested equal in
# tests/test_deadletters_cli.py): the core names no wing.
REPLAY_HINTS = {
    "range-partition": "a range partition is resumed, not replayed: fix the cause, then "
                       "start the job again (tasks.ranges.start)",
    "restock": "a restock entry is not a task: give the stock back by hand once the entry's "
               "problem is fixed",
    "restock-rebuild": "force a rebuild of the node (tasks.restock.rebuild) once its cause is "
                       "fixed",
    OVERSIZED_KIND: "only the first bytes of the message were kept; send a smaller one",
    "compensation": "a compensation is not a task: run it by hand with the payload's data",
}

# Width of a console whose output is piped: wide enough that no table row is wrapped or cut,
# so each row is one line a script can read (`--json` is the format meant for programs).
PIPED_WIDTH = 10_000


def console_for() -> Console:
    """The console CLI output goes to: in a terminal, the terminal's width (tables fold their
    cells to fit it, nothing is cut with "..."); piped, PIPED_WIDTH columns and no colour."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=PIPED_WIDTH, no_color=True, highlight=False)


@dataclass(frozen=True)
class LettersView:
    """Dead letters as `status` shows them: a count per kind and the newest few."""

    counts: dict[str, int]
    recent: list[Summary]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def letters_view(sessions: sessionmaker[Session], recent: int = RECENT_LETTERS) -> LettersView:
    """A count per kind (SQL) and the newest `recent` letters without their payloads."""
    letters = DeadLetters(sessions)
    counts = letters.counts()
    return LettersView(counts, letters.recent(recent) if counts else [])


def letters_renderable(view: LettersView) -> RenderableType:
    if not view.counts:
        return Text("no dead letters")
    head = Text(f"dead letters: {view.total:,} ("
                + ", ".join(f"{kind}: {n:,}" for kind, n in sorted(view.counts.items())) + ")")
    table = Table(title=f"newest {len(view.recent)} dead letters")
    for column in ("id", "kind", "ref", "created (UTC)", "replayed as", "reason"):
        table.add_column(column, overflow="fold")
    for letter in view.recent:
        table.add_row(str(letter.id), letter.kind, quote_text(letter.ref),
                      f"{letter.created_at:%Y-%m-%d %H:%M:%S}", letter.replay_task_id or "-",
                      quote_text(letter.reason, 120))
    return Group(head, table)


def letters_json(view: LettersView) -> dict[str, Any]:
    return {"total": view.total, "counts": dict(sorted(view.counts.items())),
            "recent": [{"id": s.id, "kind": s.kind, "ref": s.ref, "reason": s.reason,
                        "created_at": s.created_at.isoformat(),
                        "replay_task_id": s.replay_task_id} for s in view.recent]}


def render_letters(sessions: sessionmaker[Session], console: Console | None = None) -> None:
    """Dead letters: a count per kind (SQL), and the newest few without their payloads."""
    (console or console_for()).print(letters_renderable(letters_view(sessions)))


def quote_text(text: str, limit: int = 48) -> str:
    """`text` cut to `limit` characters (a ref or reason may quote a long bad value)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def with_hint(exc: Exception) -> str:
    """A store refusal's message, with what to do instead when its letter's kind has a hint
    (the CLI's stderr line and the console's refusal say the same)."""
    hint = REPLAY_HINTS.get(getattr(exc, "kind", ""), "")
    return f"{exc}" + (f" ({hint})" if hint else "")
