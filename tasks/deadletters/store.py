"""The dead-letter store: what failed for good goes here with its reason, never into the void.

Letters are appended by every wing (`add`), listed and shown by `python -m tasks deadletters`,
replayed once (`replay`: the letter's task sent again under a new task id, recorded on the
letter) and deleted by id, by age (`purge`, `prune`) or by the retention prune.
"""

from __future__ import annotations

import builtins
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.config.settings import redact
from tasks.deadletters.kinds import retry_of
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.store.db import WRITE_INTENT, affected, utcnow

__all__ = ["DeadLetters", "Letter", "Summary", "PRUNE_BATCH", "DeadLetterError",
           "LetterNotFound", "NotReplayable", "AlreadyReplayed", "Replay", "replay_refusal",
           "redact_payload", "Send"]

# Rows deleted per transaction by `prune` (short transactions, bounded locks).
PRUNE_BATCH = 1000

# A payload key whose value is hidden whole when a letter is shown (a password argument).
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|credential|api_?key", re.I)

# Sends a task: (name, args, kwargs, task_id); the app's `send_task` is passed in, so the
# store never imports the app (which imports the task base, which writes letters).
Send = Callable[[str, list[Any], dict[str, Any], str], Any]

log = logging.getLogger("tasks.deadletters.store")


class DeadLetterError(Exception):
    """A dead-letter command that was refused; the message says why. Nothing was changed."""


class LetterNotFound(DeadLetterError):
    def __init__(self, letter_id: int) -> None:
        super().__init__(f"no dead letter with id {letter_id}")


class NotReplayable(DeadLetterError):
    def __init__(self, letter_id: int, kind: str, reason: str) -> None:
        self.kind = kind
        super().__init__(f"dead letter {letter_id} ({kind}) is not replayable: {reason}")


class AlreadyReplayed(DeadLetterError):
    def __init__(self, letter_id: int, when: datetime | None, task_id: str | None) -> None:
        at = f" at {when:%Y-%m-%d %H:%M:%S} UTC" if when is not None else ""
        super().__init__(f"dead letter {letter_id} was already replayed{at} as task "
                         f"{task_id}: a letter is replayed at most once")


@dataclass(frozen=True)
class Summary:
    """A dead letter without its payload, as `status` and `deadletters list` show it."""

    id: int
    kind: str
    ref: str
    reason: str
    created_at: datetime
    replayed_at: datetime | None = None
    replay_task_id: str | None = None


@dataclass(frozen=True)
class Letter:
    id: int
    kind: str
    ref: str
    reason: str
    payload: dict[str, Any]
    created_at: datetime
    replayed_at: datetime | None = None
    replay_task_id: str | None = None


@dataclass(frozen=True)
class Replay:
    """A replay that was sent: the letter, the task's name and its new task id (or, for a kind
    its wing replays itself, the kind, no task id and `note`: what the wing did)."""

    letter_id: int
    task: str
    task_id: str
    note: str | None = None


def replay_refusal(payload: Any, kind: str | None = None) -> str | None:
    """Why a letter with `payload` cannot be replayed, or None when it can: only a letter that
    keeps a task's name and its whole arguments (`task`, `args`, `kwargs`) can be sent again,
    or one of a `kind` its wing replays itself (`tasks.deadletters.kinds.retry_of`)."""
    if kind is not None and retry_of(kind) is not None:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
        return "it keeps no task name"
    if not isinstance(payload.get("args"), list) or not isinstance(payload.get("kwargs"), dict):
        kept = ", ".join(sorted(payload)) or "nothing"
        return f"it keeps no task arguments (only {kept})"
    return None


def redact_payload(value: Any, depth: int = 0) -> Any:
    """`value` with credentials hidden: values under secret-looking keys, passwords in URLs."""
    if isinstance(value, str):
        return redact(value)
    if depth >= 8:
        return value
    if isinstance(value, dict):
        return {k: "***" if isinstance(k, str) and _SECRET_KEY.search(k)
                else redact_payload(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_payload(v, depth + 1) for v in value]
    return value


class DeadLetters:
    """Store in the database (the source of truth survives a Redis loss). Letters are only
    appended; a replay sets `replayed_at` once; `purge` and `prune` delete them."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def add(self, kind: str, ref: str, reason: str, payload: dict[str, Any]) -> None:
        """Keep `payload` (JSON-serializable) under `kind`/`ref` with `reason`."""
        body = json.dumps(payload, default=repr, sort_keys=True)
        with self.sessions.begin() as session:
            session.execute(insert(DEAD_LETTERS).values(
                kind=kind, ref=ref[:255], reason=reason, payload=body, created_at=utcnow()))
        log.warning("dead letter %s %s: %s", kind, ref, reason)

    def list(self, kind: str | None = None) -> list[Letter]:
        query = select(DEAD_LETTERS).order_by(DEAD_LETTERS.c.id)
        if kind is not None:
            query = query.where(DEAD_LETTERS.c.kind == kind)
        with self.sessions() as session:
            rows = session.execute(query).all()
        return [_letter(r) for r in rows]

    def get(self, letter_id: int) -> Letter:
        """The letter `letter_id`; LetterNotFound when there is none."""
        with self.sessions() as session:
            row = session.execute(
                select(DEAD_LETTERS).where(DEAD_LETTERS.c.id == letter_id)).first()
        if row is None:
            raise LetterNotFound(letter_id)
        return _letter(row)

    def counts(self) -> dict[str, int]:
        """Letters per kind, counted by the database (no payload is read)."""
        query = select(DEAD_LETTERS.c.kind, func.count()).group_by(DEAD_LETTERS.c.kind)
        with self.sessions() as session:
            return {kind: int(n) for kind, n in session.execute(query)}

    def recent(self, limit: int = 10, kind: str | None = None) -> builtins.list[Summary]:
        """The newest `limit` letters (of `kind`, if given), without their payloads."""
        d = DEAD_LETTERS.c
        query = select(d.id, d.kind, d.ref, d.reason, d.created_at, d.replayed_at,
                       d.replay_task_id).order_by(d.id.desc())
        if kind is not None:
            query = query.where(d.kind == kind)
        with self.sessions() as session:
            rows = session.execute(query.limit(limit)).all()
        return [Summary(r.id, r.kind, r.ref, r.reason, r.created_at, r.replayed_at,
                        r.replay_task_id) for r in rows]

    def replay(self, letter_id: int, send: Send) -> Replay:
        """Send the letter's task again, with its name and arguments, under a new task id.

        The replay is claimed first (a compare-and-set on `replayed_at IS NULL`), so two
        operators replaying one letter send it once; if sending fails the claim is taken back
        and the error raised. A letter of a kind its wing replays itself is handed to the
        wing's `retry`, which claims it in its own transaction. Raises LetterNotFound,
        NotReplayable or AlreadyReplayed.
        """
        letter = self.get(letter_id)
        retry = retry_of(letter.kind)
        if retry is not None:
            if letter.replayed_at is not None:
                raise AlreadyReplayed(letter_id, letter.replayed_at, letter.replay_task_id)
            note = retry(self.sessions, letter_id)
            log.info("dead letter %d replayed: %s", letter_id, note)
            return Replay(letter_id, letter.kind, "", note)
        refusal = replay_refusal(letter.payload)
        if refusal is not None:
            raise NotReplayable(letter_id, letter.kind, refusal)
        task_id = str(uuid.uuid4())
        d = DEAD_LETTERS.c
        with self.sessions.begin() as session:
            claimed = affected(session.execute(
                update(DEAD_LETTERS).where(d.id == letter_id, d.replayed_at.is_(None))
                .values(replayed_at=utcnow(), replay_task_id=task_id)))
        if not claimed:
            again = self.get(letter_id)
            raise AlreadyReplayed(letter_id, again.replayed_at, again.replay_task_id)
        payload = letter.payload
        try:
            send(payload["task"], payload["args"], payload["kwargs"], task_id)
        except BaseException:
            with self.sessions.begin() as session:
                session.execute(update(DEAD_LETTERS).where(
                    d.id == letter_id, d.replay_task_id == task_id)
                    .values(replayed_at=None, replay_task_id=None))
            raise
        log.info("dead letter %d replayed: %s sent as task %s", letter_id, payload["task"],
                 task_id)
        return Replay(letter_id, payload["task"], task_id)

    def purge(self, letter_id: int) -> None:
        """Delete the letter `letter_id`; LetterNotFound when there is none."""
        with self.sessions.begin() as session:
            gone = affected(session.execute(
                delete(DEAD_LETTERS).where(DEAD_LETTERS.c.id == letter_id)))
        if not gone:
            raise LetterNotFound(letter_id)
        log.info("dead letter %d purged", letter_id)

    def prune(self, retention: float, now: datetime | None = None) -> int:
        """Delete letters created more than `retention` seconds before `now`; return how many.

        Works in batches of PRUNE_BATCH ids so no transaction holds many row locks.
        """
        cutoff = (now or utcnow()) - timedelta(seconds=retention)
        d = DEAD_LETTERS.c
        deleted = 0
        while True:
            with self.sessions.begin() as session:
                # Reads, then deletes: SQLite's write lock up front.
                session.connection(execution_options=WRITE_INTENT)
                ids = list(session.execute(select(d.id).where(d.created_at < cutoff)
                                           .order_by(d.id).limit(PRUNE_BATCH)).scalars())
                if ids:
                    session.execute(delete(DEAD_LETTERS).where(d.id.in_(ids)))
            deleted += len(ids)
            if len(ids) < PRUNE_BATCH:
                break
        if deleted:
            log.info("pruned %d dead letters older than %gs", deleted, retention)
        return deleted


def _letter(row: Any) -> Letter:
    return Letter(row.id, row.kind, row.ref, row.reason, json.loads(row.payload),
                  row.created_at, row.replayed_at, row.replay_task_id)
