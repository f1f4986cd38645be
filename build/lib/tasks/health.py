"""A small health task: `celery -A tasks call tasks.health.ping`."""

from __future__ import annotations

import os
import socket
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from tasks.app import app, settings
from tasks.resources import resources_for

__all__ = ["ping"]


@app.task(name="tasks.health.ping")
def ping() -> dict[str, Any]:
    """Report that a worker runs, and whether it reaches Redis and the database."""
    res = resources_for(settings)
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
