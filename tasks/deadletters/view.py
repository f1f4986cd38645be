"""The dead letters' view, plain data: a count per kind and the newest few (`status`), one
letter's facts and its shown payload (`deadletters show`, the console), and what the CLI and
the console both say about a letter (the replay hints, the show limit, the replay's send
retry). The CLI draws it (`tasks.cli.render`); the console serialises it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from tasks.config.clock import iso
from tasks.deadletters.store import DeadLetters, Letter, Summary, redact_payload, replay_refusal

__all__ = ["RECENT_LETTERS", "LettersView", "letters_view", "letters_json", "summary_dict",
           "letter_facts", "shown_payload", "SHOW_LIMIT", "SEND_RETRY",
           "with_hint"]

# Dead letters `status` lists (newest first, without payloads); the rest are only counted.
RECENT_LETTERS = 10

# Characters of a payload `deadletters show` and the console print; the rest is counted, not
# shown.
SHOW_LIMIT = 4000

# How a replay's publish retries when the broker is away (then the replay is refused).
SEND_RETRY = {"max_retries": 2, "interval_start": 0.0, "interval_step": 0.5,
              "interval_max": 1.0}



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


def letters_json(view: LettersView) -> dict[str, Any]:
    """The `dead_letters` of `status --json`."""
    return {"total": view.total, "counts": dict(sorted(view.counts.items())),
            "recent": [{"id": s.id, "kind": s.kind, "ref": s.ref, "reason": s.reason,
                        "created_at": iso(s.created_at),
                        "replay_task_id": s.replay_task_id} for s in view.recent]}


def summary_dict(letter: Summary | Letter, timespec: str = "seconds") -> dict[str, Any]:
    """A letter without its payload as JSON-able values (`deadletters list --json`, the
    console's list), its times in ISO 8601 with their zone (`tasks.config.clock.iso`)."""
    return {"id": letter.id, "kind": letter.kind, "ref": letter.ref, "reason": letter.reason,
            "created_at": iso(letter.created_at, timespec),
            "replayed_at": iso(letter.replayed_at, timespec),
            "replay_task_id": letter.replay_task_id}


def letter_facts(letter: Letter, timespec: str = "seconds") -> dict[str, Any]:
    """`summary_dict` and whether the letter can be replayed now, in the order `deadletters
    show` prints them."""
    summary = summary_dict(letter, timespec)
    replayable = (replay_refusal(letter.payload, letter.kind) is None
                  and letter.replayed_at is None)
    first = ("id", "kind", "ref", "reason", "created_at")
    return {**{k: summary[k] for k in first}, "replayable": replayable,
            **{k: v for k, v in summary.items() if k not in first}}


def shown_payload(letter: Letter) -> tuple[Any, str, bool]:
    """The payload with its credentials hidden, that as indented JSON text cut at SHOW_LIMIT
    characters (the rest counted), and whether it was cut."""
    shown = redact_payload(letter.payload)
    text = json.dumps(shown, indent=2, sort_keys=True, default=str)
    if len(text) <= SHOW_LIMIT:
        return shown, text, False
    return shown, f"{text[:SHOW_LIMIT]}\n... ({len(text):,} characters, cut)", True


def with_hint(exc: Exception) -> str:
    """A store refusal's message, with what to do instead when its letter's kind has a hint
    (the CLI's stderr line and the console's refusal say the same). The kinds are the ones
    registered (`tasks.deadletters.kinds`): the app registers every wing's."""
    from tasks.deadletters.kinds import hint as kind_hint

    hint = kind_hint(getattr(exc, "kind", ""))
    return f"{exc}" + (f" ({hint})" if hint else "")
