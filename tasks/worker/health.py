"""Health and housekeeping tasks: `celery -A tasks call tasks.health.ping`; beat runs
`tasks.health.prune_dead_letters` hourly (DEAD_LETTER_RETENTION)."""

from __future__ import annotations

import os
import socket
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from tasks.celery import app
from tasks.config.settings import settings_of
from tasks.deadletters.store import DeadLetters
from tasks.store.resources import resources_for

__all__ = ["ping", "prune_dead_letters"]


@app.task(name="tasks.health.ping")
def ping() -> dict[str, Any]:
    """Report that a worker runs, and whether it reaches Redis and the database."""
    res = resources_for(settings_of(app))
    report: dict[str, Any] = {"worker": socket.gethostname(), "pid": os.getpid()}
    try:
        report["redis"] = "ok" if res.redis.ping() else "no answer"
    except (RedisError, OSError) as exc:  # a probe reports a failure instead of raising
        report["redis"] = f"error: {type(exc).__name__}"
    try:
        with res.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        report["database"] = "ok"
    except (SQLAlchemyError, OSError) as exc:
        report["database"] = f"error: {type(exc).__name__}"
    report["status"] = "ok" if report["redis"] == report["database"] == "ok" else "degraded"
    return report


@app.task(name="tasks.health.prune_dead_letters")
def prune_dead_letters() -> int:
    """Delete dead letters older than DEAD_LETTER_RETENTION; return how many were deleted.

    Idempotent: a duplicate or concurrent run deletes what is left, or nothing.
    """
    settings = settings_of(app)
    return DeadLetters(resources_for(settings).sessions).prune(settings.dead_letter_retention)
