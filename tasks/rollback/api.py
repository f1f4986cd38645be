"""The public API a task uses (`checkpoint`, `step`, `rollback`) on this process's journal.

The process's `Journal` is created on first use (a task that records no checkpoint costs
nothing: `settle` and the signal handlers look at it and return without any I/O) and
forgotten in a forked pool child, which starts with no open executions and its own
connections.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task, current_task

from tasks.celery import settings
from tasks.rollback.errors import NotInTask
from tasks.rollback.fences import Step
from tasks.rollback.journals import Journal, carries_over
from tasks.rollback.runner import RollbackReport
from tasks.rollback.tables import OwnerState
from tasks.store.resources import resources_for
from tasks.worker.base import PlatformTask

__all__ = ["checkpoint", "current", "journal", "rollback", "rollback_now", "set_journal",
           "settle", "step"]

_journal: Journal | None = None
_journal_lock = threading.Lock()


def journal() -> Journal:
    """This process's Journal on the platform's database and Redis (created on first use)."""
    global _journal
    with _journal_lock:
        if _journal is None:
            res = resources_for(settings)
            _journal = Journal(res.sessions, res.leases, lease_ttl=settings.lease_ttl,
                               handover_grace=settings.visibility_timeout + settings.lease_ttl)
        return _journal


def current() -> Journal | None:
    """This process's Journal if it was created, else None (no I/O): a process without one
    holds no journal."""
    return _journal


def set_journal(replacement: Journal | None) -> None:
    """Use `replacement` as this process's journal (tests); None: back to the default."""
    global _journal
    with _journal_lock:
        _journal = replacement


def _forget_after_fork() -> None:
    global _journal, _journal_lock
    # A pool child starts with no open executions and its own connections (resources_for).
    _journal_lock = threading.Lock()
    _journal = None


os.register_at_fork(after_in_child=_forget_after_fork)


def _running() -> tuple[str, str, int]:
    """(task name, task id, attempt) of the running PlatformTask, or NotInTask."""
    task = current_task
    request = getattr(task, "request", None)
    task_id = getattr(request, "id", None)
    if task is None or not task_id:
        raise NotInTask("checkpoint() must be called inside a running Celery task")
    if not isinstance(task._get_current_object(), PlatformTask):
        # Only PlatformTask checks the journal before Celery stores SUCCESS (settle()).
        raise NotInTask(f"checkpoint() needs a task built on tasks.worker.base.PlatformTask, "
                        f"and {task.name} is not")
    return task.name, task_id, int(getattr(request, "retries", 0) or 0)


def checkpoint(name: str, undo: str, data: dict[str, Any]) -> int:
    """Journal step `name` of the running task, undone by compensation `undo` with `data`.

    Write-ahead: call it BEFORE the step's effect; if it raises, do not run the effect.
    Raises UnknownCompensation for an unregistered `undo`, TypeError for data that is not a
    JSON object, NotInTask outside a PlatformTask: all before anything is written;
    JournalLost once the journal is no longer this execution's. Returns the seq.
    """
    task_name, task_id, attempt = _running()
    return journal().record(task_id, task_name, attempt, name, undo, data)


@contextmanager
def step(name: str, undo: str, data: dict[str, Any]) -> Iterator[Step]:
    """``with step("ship", undo="cancel_shipment", data={...}) as s: ship(fence=s.fence)``:
    the step is journaled as intended before the block runs and confirmed after it.

    If entering raises (JournalLost above all), the block has not run. A store that checks
    `s.fence` (`tasks.rollback.fences`) refuses the effect once the journal is taken over.
    If confirming finds the journal taken over, the step's compensation runs again (for an
    effect nothing fenced) and JournalLost is raised.
    """
    task_name, task_id, attempt = _running()
    with journal().step(task_id, task_name, attempt, name, undo, data) as handle:
        yield handle


def rollback(task_id: str, reason: str) -> RollbackReport:
    """Compensate what execution `task_id` recorded, in reverse order, each step at most once.

    For the journal's owner (the failure and retry handlers call it in the owning process):
    it does not take the journal over. Any other process sends `tasks.rollback.rollback`,
    which compensates only once the owner is gone, as the sweeper does.
    Idempotent: a second call finds nothing left and runs nothing.
    Closes this process's ownership of the journal afterwards (state 'rolled_back'), if any.
    A rollback that did not finish (its process terminated inside a compensation: billiard
    raises SystemExit on SIGTERM; the database away) leaves the journal open and gives up
    its lease, so the next sweep takes it over and runs the rest, the interrupted step first.
    """
    found = journal()
    try:
        report = found.rollback(task_id, reason)
    except BaseException:
        found.close(task_id)
        raise
    found.close(task_id, final=OwnerState.ROLLED_BACK)
    return report


def rollback_now(task_id: str, reason: str) -> RollbackReport:
    """Roll back at once, before Celery records the failure (e.g. on SoftTimeLimitExceeded),
    if this execution owns the journal; the later task_failure handler then finds nothing
    left to do.

    An execution that never opened the journal (a duplicate delivery whose soft limit fired
    while it waited for the journal lease of a live first delivery) undoes nothing: the
    journal is the owner's, and the sweeper's once that owner is gone.
    """
    found = _journal
    if found is None or not found.holds(task_id):
        return RollbackReport(task_id, reason)
    return rollback(task_id, reason)


def settle(task: Task) -> None:
    """`task` returned normally: raise JournalLost if its journal is no longer its own (then it
    fails instead of succeeding), else delete the journal. Called by PlatformTask before
    Celery stores the result; no I/O for a task that has no journal."""
    request = task.request
    task_id = request.id
    found = _journal
    if not task_id or found is None:
        return
    attempt = int(getattr(request, "retries", 0) or 0)
    if found.holds(task_id) or carries_over(attempt):
        found.settle(task_id, task.name, attempt)
