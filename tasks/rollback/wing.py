"""What the rollback wing brings to the platform (listed by `tasks.wings`)."""

from __future__ import annotations

from tasks.rollback.metrics import RollbackSeries
from tasks.rollback.settings import RollbackSettings
from tasks.wing import BeatEntry, DeadLetterKind, Route, Wing

__all__ = ["WING", "COMPENSATION_KIND"]

# Dead-letter kind of a compensation that kept failing (tasks.rollback.runner).
COMPENSATION_KIND = "compensation"

WING = Wing(
    name="rollback",
    # The tasks and the signal handlers that roll a failed task back.
    task_modules=("tasks.rollback.tasks",),
    tables="tasks.rollback.tables",
    settings=RollbackSettings,
    routes=(Route("tasks.rollback.*", lambda s: s.control_queue),),
    # Rolls back executions whose journal lease lapsed (hard limit, SIGKILL).
    beat=(BeatEntry("rollback-sweep", "tasks.rollback.sweep", lambda s: s.reconcile_interval),),
    series=RollbackSeries,
    dead_letter_kinds=(DeadLetterKind(
        COMPENSATION_KIND, "a compensation is not a task: run it by hand with the payload's "
                           "data"),),
)
