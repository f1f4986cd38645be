"""Worker lifecycle: a warm shutdown reaches the partitions running in pool processes.

On SIGTERM Celery's main process stops consuming and waits for running tasks, but the prefork
children are not told. `shutdown_requested` is a multiprocessing Event created in the main
process before the pool forks, so every child shares it: the main process sets it on
`worker_shutting_down`, and a running partition sees it at its next batch boundary, commits,
releases its lease and hands the partition over.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from celery.signals import worker_shutting_down

__all__ = ["shutdown_requested"]

shutdown_requested = multiprocessing.get_context("fork").Event()


@worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    shutdown_requested.set()

