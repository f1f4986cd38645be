"""The rollback wing's public names, re-exported by `tasks.rollback` (imported on the first
name read from it): importing this module imports the wing whole, its Celery tasks, signal
handlers and PlatformTask hooks included."""

from __future__ import annotations

from tasks.rollback.api import (
    checkpoint,
    journal,
    rollback,
    rollback_now,
    set_journal,
    settle,
    step,
)
from tasks.rollback.errors import (
    JournalBusy,
    JournalLost,
    NotInTask,
    RollbackError,
    UnknownCompensation,
)
from tasks.rollback.journals import Journal, rollback_on_retry
from tasks.rollback.registry import compensation, compensations
from tasks.rollback.runner import COMPENSATION_POLICY, RollbackReport, StepOutcome
from tasks.rollback.signals import (
    checkpoint_recorded,
    rollback_finished,
    rollback_started,
    rollback_step_failed,
    rollback_step_succeeded,
)
from tasks.rollback.sweeper import sweep
from tasks.rollback.tables import JOURNAL, OWNERS, JournalState, OwnerState
from tasks.rollback.tasks import rollback_task, sweep_task

__all__ = [
    "COMPENSATION_POLICY",
    "JOURNAL",
    "OWNERS",
    "Journal",
    "JournalBusy",
    "JournalLost",
    "JournalState",
    "NotInTask",
    "OwnerState",
    "RollbackError",
    "RollbackReport",
    "StepOutcome",
    "UnknownCompensation",
    "checkpoint",
    "checkpoint_recorded",
    "compensation",
    "compensations",
    "journal",
    "rollback",
    "rollback_finished",
    "rollback_now",
    "rollback_on_retry",
    "rollback_started",
    "rollback_step_failed",
    "rollback_step_succeeded",
    "rollback_task",
    "set_journal",
    "settle",
    "step",
    "sweep",
    "sweep_task",
]
