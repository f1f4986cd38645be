"""Which queue each task runs on, so that no kind of work waits behind another (issue 11).

    ranges   tasks.ranges.run_partition               (long: up to RANGE_SLICE each)
    restock  tasks.restock.*                          (drains, syncs, rebuilds, orders)
    control  tasks.ranges.* (start, reconcile, pause, resume, cancel, retry_failed,
             throttle ...), tasks.health.*, tasks.rollback.*
    celery   everything else (the default queue: your own tasks, the examples)

The table names tasks by strings and glob patterns only: the core never imports a wing, and a
control added to `tasks.ranges` later lands on `control` without an edit here. Celery's
`task_routes` tries exact names before patterns, so `run_partition` wins over `tasks.ranges.*`.

Every queue is declared in `task_queues`, so a worker started without `-Q` consumes all four
(one worker still runs everything); the Procfile and compose give partitions their own workers
and control and restock theirs (README, "Running the platform").
"""

from __future__ import annotations

from typing import Any

from kombu import Exchange, Queue

from tasks.config.settings import Settings

__all__ = ["RULES", "queue_names", "task_routes", "task_queues", "routing_config"]

# (task name or glob pattern, which queue) -> the Settings field holding that queue's name.
RULES: tuple[tuple[str, str], ...] = (
    ("tasks.ranges.run_partition", "ranges_queue"),
    ("tasks.ranges.*", "control_queue"),
    ("tasks.health.*", "control_queue"),
    ("tasks.rollback.*", "control_queue"),
    ("tasks.restock.*", "restock_queue"),
)


def queue_names(settings: Settings) -> tuple[str, ...]:
    """Every queue the platform uses, the default queue first, each once."""
    names = (settings.default_queue, settings.ranges_queue, settings.control_queue,
             settings.restock_queue)
    return tuple(dict.fromkeys(names))


def task_routes(settings: Settings) -> dict[str, dict[str, str]]:
    """Celery's `task_routes`: task name or pattern -> {"queue": name}."""
    return {pattern: {"queue": getattr(settings, field)} for pattern, field in RULES}


def task_queues(settings: Settings) -> tuple[Queue, ...]:
    """Celery's `task_queues`: every queue, each on a direct exchange of its own name (what
    Celery makes for its default queue), so a worker without `-Q` consumes them all."""
    return tuple(Queue(name, Exchange(name), routing_key=name) for name in queue_names(settings))



def routing_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration of the queues: the app's, and any client's that sends platform
    tasks by name (a bare `Celery()` client would send them all to its default queue)."""
    return {
        "task_queues": task_queues(settings),
        "task_default_queue": settings.default_queue,
        "task_routes": task_routes(settings),
    }
