"""The dead-letter store: what failed for good goes here with its reason, never into the void."""

from __future__ import annotations

import builtins
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from tasks.db import utcnow
from tasks.models import DEAD_LETTERS

__all__ = ["DeadLetters", "Letter", "Summary", "PRUNE_BATCH"]

# Rows deleted per transaction by `prune` (short transactions, bounded locks).
PRUNE_BATCH = 1000

log = logging.getLogger("tasks.deadletter")


@dataclass(frozen=True)
class Summary:
    """A dead letter without its payload, as `python -m tasks status` lists it."""

    id: int
    kind: str
    ref: str
    reason: str
    created_at: datetime


@dataclass(frozen=True)
class Letter:
    id: int
    kind: str
    ref: str
    reason: str
    payload: dict[str, Any]
    created_at: datetime


class DeadLetters:
    """Store in the database (the source of truth survives a Redis loss). Letters are only
    appended, and deleted by `prune` once older than DEAD_LETTER_RETENTION."""

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
        return [Letter(r.id, r.kind, r.ref, r.reason, json.loads(r.payload), r.created_at)
                for r in rows]

    def counts(self) -> dict[str, int]:
        """Letters per kind, counted by the database (no payload is read)."""
        query = select(DEAD_LETTERS.c.kind, func.count()).group_by(DEAD_LETTERS.c.kind)
        with self.sessions() as session:
            return {kind: int(n) for kind, n in session.execute(query)}

    def recent(self, limit: int = 10) -> builtins.list[Summary]:
        """The newest `limit` letters, without their payloads."""
        d = DEAD_LETTERS.c
        query = select(d.id, d.kind, d.ref, d.reason, d.created_at).order_by(d.id.desc())
        with self.sessions() as session:
            rows = session.execute(query.limit(limit)).all()
        return [Summary(r.id, r.kind, r.ref, r.reason, r.created_at) for r in rows]

    def prune(self, retention: float, now: datetime | None = None) -> int:
        """Delete letters created more than `retention` seconds before `now`; return how many.

        Works in batches of PRUNE_BATCH ids so no transaction holds many row locks.
        """
        cutoff = (now or utcnow()) - timedelta(seconds=retention)
        d = DEAD_LETTERS.c
        deleted = 0
        while True:
            with self.sessions.begin() as session:
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
