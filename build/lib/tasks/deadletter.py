"""The dead-letter store: what failed for good goes here with its reason, never into the void."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker

from tasks.models import DEAD_LETTERS, utcnow

__all__ = ["DeadLetters", "Letter"]

log = logging.getLogger("tasks.deadletter")


@dataclass(frozen=True)
class Letter:
    id: int
    kind: str
    ref: str
    reason: str
    payload: dict[str, Any]
    created_at: datetime


class DeadLetters:
    """Append-only store in the database (the source of truth survives a Redis loss)."""

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
