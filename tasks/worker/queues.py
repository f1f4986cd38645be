"""Which queue each task runs on, so that no kind of work waits behind another.

The core routes its own tasks (`tasks.health.*` on CONTROL_QUEUE); each wing declares its
rules (`Wing.routes`: a task name or glob pattern and the queue it goes to, read from the
settings), so this module names no wing. Celery's `task_routes` tries exact names before
patterns, so a wing's exact name (`...run_partition`) wins over its pattern (`...*`). Tasks
no rule names run on DEFAULT_QUEUE (your own tasks, the examples).

Every queue is declared in `task_queues`, so a worker started without `-Q` consumes them all
(one worker still runs everything); the Procfile and compose give partitions their own workers
and control and restock theirs (README, "Running the platform").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kombu import Exchange, Queue

from tasks.config.settings import Settings
from tasks.wing import Route, Wing, each

__all__ = ["CORE_ROUTES", "routes", "queue_names", "task_routes", "task_queues",
           "routing_config"]

# The core's own tasks: health checks and housekeeping go with the controls.
CORE_ROUTES = (Route("tasks.health.*", lambda s: s.control_queue),)


def routes(wings: Iterable[Wing]) -> tuple[Route, ...]:
    """The core's rules, then every wing's, in wing order."""
    return (*CORE_ROUTES, *each(wings, "routes"))


def queue_names(settings: Settings, wings: Iterable[Wing]) -> tuple[str, ...]:
    """Every queue the platform uses, the default and control queues first, each once."""
    names = (settings.default_queue, settings.control_queue,
             *(route.queue(settings) for route in routes(wings)))
    return tuple(dict.fromkeys(names))


def task_routes(settings: Settings, wings: Iterable[Wing]) -> dict[str, dict[str, str]]:
    """Celery's `task_routes`: task name or pattern -> {"queue": name}."""
    return {route.pattern: {"queue": route.queue(settings)} for route in routes(wings)}


def task_queues(settings: Settings, wings: Iterable[Wing]) -> tuple[Queue, ...]:
    """Celery's `task_queues`: every queue, each on a direct exchange of its own name (what
    Celery makes for its default queue), so a worker without `-Q` consumes them all."""
    return tuple(Queue(name, Exchange(name), routing_key=name)
                 for name in queue_names(settings, wings))


def routing_config(settings: Settings, wings: Iterable[Wing]) -> dict[str, Any]:
    """The Celery configuration of the queues: the app's, and any client's that sends platform
    tasks by name (a bare `Celery()` client would send them all to its default queue)."""
    wings = tuple(wings)
    return {
        "task_queues": task_queues(settings, wings),
        "task_default_queue": settings.default_queue,
        "task_routes": task_routes(settings, wings),
    }
