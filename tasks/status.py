"""`python -m tasks status`, the core's part: dead letters of every kind. The wings render
their own state (`tasks.ranges.status`, `tasks.restock.status`); `tasks.__main__` puts the
three together."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletter import DeadLetters

__all__ = ["render_letters", "quote_text", "RECENT_LETTERS"]

# Dead letters `status` lists (newest first, without payloads); the rest are only counted.
RECENT_LETTERS = 10


def render_letters(sessions: sessionmaker[Session], console: Console | None = None) -> None:
    """Dead letters: a count per kind (SQL), and the newest few without their payloads."""
    console = console or Console()
    letters = DeadLetters(sessions)
    counts = letters.counts()
    if not counts:
        console.print("no dead letters")
        return
    total = sum(counts.values())
    console.print(f"dead letters: {total:,} ("
                  + ", ".join(f"{kind}: {n:,}" for kind, n in sorted(counts.items())) + ")")
    table = Table(title=f"newest {min(total, RECENT_LETTERS)} dead letters")
    for column in ("id", "kind", "ref", "created (UTC)", "reason"):
        table.add_column(column)
    for letter in letters.recent(RECENT_LETTERS):
        table.add_row(str(letter.id), letter.kind, quote_text(letter.ref),
                      f"{letter.created_at:%Y-%m-%d %H:%M:%S}", quote_text(letter.reason, 120))
    console.print(table)


def quote_text(text: str, limit: int = 48) -> str:
    """`text` cut to `limit` characters (a ref or reason may quote a long bad value)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"
