"""Small tasks that show the platform's task semantics (tests and `python -m bench overhead`
use them; users can run them with `celery -A tasks call`)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from celery import Task

from tasks.celery import app, settings
from tasks.store.resources import resources_for
from tasks.worker.base import PlatformTask
from tasks.worker.retry import RetryPolicy

__all__ = ["flaky", "noop_bare", "noop_platform", "poison", "picky", "prompt", "nap"]

# sample:{flaky,picky,poison}:{KEY}[:retries] -> attempts (and retry numbers) of a sample run.
# TTL: SAMPLE_TTL, renewed by each attempt. Owner: the sample tasks below (tests read them).
SAMPLE_KEY = "sample:"
SAMPLE_TTL = 3600


def _count(key: str, *, retries: int | None = None) -> int:
    """INCR `key` (and RPUSH `retries` to `key:retries`), both with the sample TTL."""
    client = resources_for(settings).redis
    with client.pipeline() as pipe:
        pipe.incr(key)
        pipe.expire(key, SAMPLE_TTL)
        if retries is not None:
            pipe.rpush(f"{key}:retries", retries)
            pipe.expire(f"{key}:retries", SAMPLE_TTL)
        return int(pipe.execute()[0])


QUICK = RetryPolicy(max_retries=4, initial_interval=0.2, max_interval=1.0, multiplier=2.0,
                    randomization=0.5, retry_on=(ConnectionError,))


@app.task(name="devtools.samples.noop_bare", base=Task)
def noop_bare() -> None:
    """A no-op on a bare Celery task class (the overhead benchmark's baseline)."""


@app.task(name="devtools.samples.noop_platform", base=PlatformTask)
def noop_platform() -> None:
    """A no-op on the platform's task base (policies, signals, journal support)."""


@app.task(name="devtools.samples.flaky", base=PlatformTask, bind=True, retry_policy=QUICK)
def flaky(self: PlatformTask, key: str, failures: int) -> dict[str, Any]:
    """Fail with ConnectionError `failures` times (counted in Redis under `key`), then succeed."""
    attempt = _count(f"{SAMPLE_KEY}flaky:{key}", retries=self.request.retries)
    if attempt <= failures:
        raise ConnectionError(f"attempt {attempt}: the service is away")
    return {"attempts": attempt, "retries": self.request.retries}


@app.task(name="devtools.samples.picky", base=PlatformTask, retry_policy=QUICK)
def picky(key: str) -> None:
    """Fail with a ValueError: not in the policy's retry_on, so never retried."""
    _count(f"{SAMPLE_KEY}picky:{key}")
    raise ValueError(f"{key} is malformed")


@app.task(name="devtools.samples.poison", base=PlatformTask)
def poison(key: str) -> None:
    """A poison message: it kills the pool process that runs it, every time."""
    _count(f"{SAMPLE_KEY}poison:{key}")
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="devtools.samples.prompt", base=PlatformTask, schedule_to_start=1.0)
def prompt() -> str:
    """Worth running only within a second of being sent (schedule-to-start limit)."""
    return "started in time"


@app.task(name="devtools.samples.nap", base=PlatformTask)
def nap(seconds: float) -> float:
    """Sleep `seconds`, then return them (a busy worker holding an unacknowledged message)."""
    time.sleep(seconds)
    return seconds
