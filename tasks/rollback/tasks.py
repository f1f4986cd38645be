"""How the rollback wing is wired into Celery and into every PlatformTask run.

    returns normally                 -> settle(): rows deleted (PlatformTask hook)
    soft time limit                  -> rollback_now() before the failure is recorded (hook)
    fails for good                   -> task_failure: rollback()
    task_retry                       -> rollback() of the failed attempt (ROLLBACK_ON_RETRY=1),
                                        or handed over to the next attempt (=0)
    a retried attempt starts         -> task_prerun: it adopts the handed-over journal (=0)
    task_revoked(terminate=True)     -> a `tasks.rollback.rollback` task rolls it back once its
                                        journal lease is gone (the sweeper's takeover); a task
                                        whose process ignored the signal runs on untouched
    a worker becomes ready           -> a `tasks.rollback.sweep` task (beat sends one every
                                        few seconds too)

Importing this module installs the hooks and connects the handlers; Celery imports it (the
wing's task module: tasks/rollback/wing.py). The tasks keep their names `tasks.rollback.*`
(`name=` below).
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from celery import Task
from celery.signals import task_failure, task_prerun, task_retry, task_revoked, worker_ready

from tasks.celery import app, settings
from tasks.rollback.api import current, journal, rollback, rollback_now, settle
from tasks.rollback.errors import JournalLost
from tasks.rollback.journals import carries_over, rollback_on_retry
from tasks.rollback.settings import rollback_settings
from tasks.rollback.sweeper import Sweeper, TakeBack, sweep
from tasks.store.db import utcnow
from tasks.store.resources import resources_for
from tasks.store.validate import text_arg
from tasks.worker.base import PlatformTask, TaskHooks, install_hooks

__all__ = ["HOOKS", "ROLLBACK_LOOKS", "rollback_task", "sweep_task"]

log = logging.getLogger("tasks.rollback")

# How many times the rollback task looks at a journal whose lease is held before it leaves it
# to its owner. A dead owner's lease lapses within LEASE_TTL, so the second look (just past
# the lease's PTTL) finds it gone; the third absorbs clock skew between the workers that
# send and run the retry. A lease still held then is being renewed: its owner lives.
ROLLBACK_LOOKS = 3

# A task whose journal was taken over fails, and is never retried: a retry would run again
# what the sweeper is undoing.
HOOKS = TaskHooks(settle=settle, roll_back_now=rollback_now, never_retried=(JournalLost,))
install_hooks(HOOKS)


@app.task(name="tasks.rollback.sweep", soft_time_limit=240, time_limit=300, acks_late=True)
def sweep_task() -> int:
    """Beat runs this every few seconds; a worker also sends one when it becomes ready."""
    res = resources_for(settings)
    return sweep(res.sessions, res.redis, retention=rollback_settings(settings).journal_retention)


@app.task(name="tasks.rollback.rollback", bind=True, soft_time_limit=240, time_limit=300,
          acks_late=True, max_retries=ROLLBACK_LOOKS - 1)
def rollback_task(self: Task, task_id: str, reason: str) -> dict[str, Any]:
    """Roll back the saga `task_id` once its owner is gone, as the sweeper would.

    Sent by the worker when a running task was terminated (`revoke(terminate=True)`), or by
    an operator (`celery -A tasks call tasks.rollback.rollback --args '["ID", "why"]'`). A
    terminate signal does not say the process died (a pool process may ignore it, e.g. under
    REMAP_SIGTERM), so while the journal lease is held this task retries just past its
    expiry, ROLLBACK_LOOKS looks in all, without holding a pool process. Then it takes the
    journal over by compare-and-set (the owner, if it still runs, is fenced: it fails with
    JournalLost) and compensates; or, the lease being renewed, it compensates nothing and
    says so (`outcome` "owner_alive"): the saga's own end decides, and the sweeper rolls it
    back if its process dies later.
    """
    task_id = text_arg("task_id", task_id, max_len=255)
    reason = text_arg("reason", reason, max_len=1000)
    res = resources_for(settings)
    found = Sweeper(res.sessions).take_back(res.redis, task_id, reason)
    if found.outcome == TakeBack.OWNER_ALIVE:
        if self.request.retries < ROLLBACK_LOOKS - 1:
            # Whole seconds: RabbitMQ quorum queues delay messages in whole seconds only.
            raise self.retry(countdown=max(1, math.ceil(
                found.alive_for + settings.lease_ttl / 4)))
        log.warning("rollback of %s (%s) not done: its journal lease is still held, renewed "
                    "by a live process; its own outcome decides, and the sweeper rolls it back "
                    "if that process dies", task_id, reason)
    report = found.report
    return {"task_id": task_id, "outcome": found.outcome,
            "compensated": report.compensated if report else [],
            "dead": report.dead if report else []}


def _request_id(request: Any) -> str | None:
    return getattr(request, "id", None)


def _attempt(request: Any) -> int:
    return int(getattr(request, "retries", 0) or 0)


def _countdown(reason: object) -> float:
    """Seconds until the retry announced by Celery's Retry exception `reason`."""
    when = getattr(reason, "when", None)
    if isinstance(when, datetime):
        now = datetime.now(when.tzinfo) if when.tzinfo else utcnow()
        return max(0.0, (when - now).total_seconds())
    if isinstance(when, int | float):
        return max(0.0, float(when))
    return 0.0


@task_prerun.connect
def _on_prerun(task_id: str | None = None, task: Task | None = None, **_: Any) -> None:
    # ROLLBACK_ON_RETRY off: a retried attempt takes the journal its predecessor handed over
    # before it does anything, so a long first step cannot outlast the handover's grace.
    # One database read per retried attempt; nothing for first attempts.
    if rollback_on_retry or not task_id or not isinstance(task, PlatformTask):
        return
    attempt = _attempt(task.request)
    if attempt > 0:
        journal().adopt(task_id, task.name, attempt)  # errors are logged; settle() retries


@task_failure.connect
def _on_failure(sender: Task | None = None, task_id: str | None = None,
                exception: BaseException | None = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    found = current()
    if task_id and found is not None and (
            found.holds(task_id) or carries_over(_attempt(request))):
        rollback(task_id, f"task failed: {exception!r}")


@task_retry.connect
def _on_retry(request: Any = None, reason: object = None, **_: Any) -> None:
    task_id = _request_id(request)
    found = current()
    if not task_id or found is None or not found.holds(task_id):
        return
    if rollback_on_retry:
        rollback(task_id, f"attempt {_attempt(request)} failed: {reason!r}")
    else:
        found.handover(task_id, _countdown(reason))


@task_revoked.connect
def _on_revoked(request: Any = None, terminated: bool = False, **_: Any) -> None:
    # Runs in the worker's main process, which holds no journal: the pool process did.
    # A task revoked before it started recorded nothing in this delivery (what an earlier
    # delivery left is the sweeper's), so only a terminated one needs a rollback; it runs
    # as a task, off the main process's event loop. `terminated` only says the signal was
    # sent: the task compensates once the journal lease is gone, never while it is renewed.
    task_id = _request_id(request)
    if terminated and task_id:
        rollback_task.apply_async((task_id, "revoked (terminated)"))


@worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    # A worker that starts may be the replacement of one that was SIGKILLed with journals.
    sweep_task.apply_async(expires=max(settings.lease_ttl, 5.0))
