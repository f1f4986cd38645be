"""The dead-letter table, on the shared `tasks.store.models.Base.metadata` (migrations 0002 and
0010 create it): every wing's letters, written through `tasks.deadletters.store`."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import DateTime, Integer, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from tasks.store.db import utcnow
from tasks.store.models import Base

__all__ = ["DeadLetter", "DEAD_LETTERS"]


class DeadLetter(Base):
    """Something that failed for good (a poison message, a compensation that kept failing):
    kept with its reason and its JSON payload, never dropped."""

    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(64))
    ref: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    # Set once, by `tasks.deadletters.store.DeadLetters.replay` (a compare-and-set on NULL):
    # when the
    # letter's task was sent again and under which new task id (migration 0010).
    replayed_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    replay_task_id: Mapped[str | None] = mapped_column(String(255), nullable=True)


DEAD_LETTERS = cast(Table, DeadLetter.__table__)
