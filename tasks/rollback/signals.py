"""The rollback wing's Celery signals. The sender of each is the task's name.

    checkpoint_recorded       a step was journaled (task_id, seq, name, compensation, data)
    rollback_started          a rollback found pending steps (task_id, reason, seqs)
    rollback_step_succeeded   one compensation ran (task_id, seq, name, compensation, data,
                              attempts)
    rollback_step_failed      one compensation kept failing and was dead-lettered (the same,
                              and error)
    rollback_finished         that rollback is done (task_id, reason, report)
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "checkpoint_recorded",
    "rollback_finished",
    "rollback_started",
    "rollback_step_failed",
    "rollback_step_succeeded",
]

checkpoint_recorded = Signal(name="checkpoint_recorded", providing_args={
    "task_id", "seq", "name", "compensation", "data"})
rollback_started = Signal(name="rollback_started", providing_args={
    "task_id", "reason", "seqs"})
rollback_step_succeeded = Signal(name="rollback_step_succeeded", providing_args={
    "task_id", "seq", "name", "compensation", "data", "attempts"})
rollback_step_failed = Signal(name="rollback_step_failed", providing_args={
    "task_id", "seq", "name", "compensation", "data", "attempts", "error"})
rollback_finished = Signal(name="rollback_finished", providing_args={
    "task_id", "reason", "report"})
