"""Worker lifecycle: a warm shutdown reaches the partitions running in pool processes.

On SIGTERM Celery's main process stops consuming and waits for running tasks, but the prefork
children are not told. `shutdown_requested` is a multiprocessing Event created in the main
process before the pool forks, so every child shares it: the main process sets it on
`worker_shutting_down`, and a running partition sees it at its next batch boundary, commits,
releases its lease and hands the partition over.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from typing import Any

from celery.signals import (
    beat_init,
    celeryd_after_setup,
    task_failure,
    task_postrun,
    task_prerun,
    task_retry,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
    worker_shutting_down,
)

from tasks.observe import metrics, tracing

__all__ = ["shutdown_requested"]

shutdown_requested = multiprocessing.get_context("fork").Event()


@worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    shutdown_requested.set()



# Metrics (METRICS_PORT): set up in the worker's main process before its pool forks, and in
# beat (which alone serves the shared state, while it leads); a pool process that exits is
# marked dead; the directory goes at shutdown. A port that cannot be bound ends the process
# with one line: a worker without its metrics would be invisible to the alerts.
@worker_init.connect
def _metrics_for_worker(sender: Any = None, **_: Any) -> None:
    if _setup_metrics(sender, "worker"):
        consumed = sender.app.amqp.queues.consume_from
        metrics.worker_serving(sender.hostname, sorted(consumed))


@celeryd_after_setup.connect
def _announce_metrics(**_: Any) -> None:
    metrics.announce()  # worker_init runs before the worker's logging is set up


@beat_init.connect
def _metrics_for_beat(sender: Any = None, **_: Any) -> None:
    if _setup_metrics(sender, "beat"):
        metrics.announce()


def _setup_metrics(sender: Any, role: str) -> bool:
    app: Any = getattr(sender, "app", None)
    settings = getattr(app, "platform_settings", None)
    if settings is None:  # not a PlatformCelery app (tasks.celery)
        return False
    # beat runs no task: its task series would be zeros beside the workers'
    names = [name for name in app.tasks if not name.startswith("celery.")] \
        if role == "worker" else []
    try:
        port = metrics.setup(settings, role, names, getattr(app, "platform_wings", ()),
                             app=app if role == "beat" else None)
    except metrics.MetricsUnavailable as exc:
        raise SystemExit(f"{role}: {exc}") from exc
    if role == "beat":
        tracing.setup(settings)
    return port is not None


# Task metrics, in the process that runs the task (a pool process, or the main process for
# the control plane's tasks). A hard time limit kills the pool process: no postrun, no
# failure signal (the redelivery cap and the partitions' state still count it).
@task_prerun.connect
def _task_started(task_id: str | None = None, **_: Any) -> None:
    if metrics.record.on is not None and task_id:
        metrics.record.on.task_started(task_id)


@task_postrun.connect
def _task_finished(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if metrics.record.on is not None and task_id and task is not None:
        metrics.record.on.task_finished(task_id, task.name)


@task_failure.connect
def _task_failed(sender: Any = None, **_: Any) -> None:
    if metrics.record.on is not None and sender is not None:
        metrics.record.on.task_failed(sender.name)


@task_retry.connect
def _task_retried(sender: Any = None, **_: Any) -> None:
    if metrics.record.on is not None and sender is not None:
        metrics.record.on.task_retried(sender.name)


# The objects a pool process starts with (modules, the app, its tasks: most of what it will
# ever hold) leave the garbage collector's generations: a full collection no longer walks them
# each time a batch allocates its thousands of rows, which cost range jobs a third of their
# time (docs/decisions.md, "Adaptive batches, skips and the driver baseline").
@worker_process_init.connect
def _freeze_startup_objects(**_: Any) -> None:
    gc.freeze()


# Tracing (TRACING=1): in each pool process after the fork, as OpenTelemetry's Celery
# instrumentation requires.
@worker_process_init.connect
def _tracing_for_pool_process(**_: Any) -> None:
    from celery import current_app

    settings = getattr(current_app, "platform_settings", None)
    if settings is not None:
        tracing.setup(settings)


@worker_process_shutdown.connect
def _pool_process_exits(pid: int | None = None, **_: Any) -> None:
    metrics.child_exited(pid or os.getpid())


@worker_shutdown.connect
def _metrics_stop(**_: Any) -> None:
    metrics.shutdown()
