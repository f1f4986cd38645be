"""The rollback wing's exceptions: one class per failure, all under `RollbackError`."""

from __future__ import annotations

__all__ = ["JournalBusy", "JournalLost", "NotInTask", "RollbackError", "UnknownCompensation"]


class RollbackError(Exception):
    """Base class of the rollback wing's errors."""


class UnknownCompensation(RollbackError, ValueError):
    """`undo` names no registered compensation (so no process could ever run it)."""


class NotInTask(RollbackError, RuntimeError):
    """`checkpoint()` was called outside a running task built on PlatformTask."""


class JournalBusy(RollbackError, RuntimeError):
    """Another live process holds this task's journal lease (a duplicate delivery runs)."""


class JournalLost(RollbackError, RuntimeError):
    """This execution no longer owns its journal: its lease was lost (a pause past the TTL,
    Redis lost the key) and the sweeper or a later delivery may be undoing its steps.

    The task fails with it, whatever it returns: a task is never reported SUCCESS for work
    someone else has undone. A step that raises it did not run its effect.
    """
