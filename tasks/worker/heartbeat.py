"""A worker's liveness heartbeat: a file its main process touches on its own timer.

A liveness probe built on a queued task (`tasks.health.ping`) waits behind the work a busy
worker is doing and kills a healthy worker; `celery inspect ping` needs the broker and a whole
Python start per probe. The heartbeat is the main process's event loop itself: the prefork
pool runs tasks in child processes, so the loop (and this timer) keeps ticking however busy the
pool is, and stops only when the main process hangs or dies. The probe reads the file's age:

    find "$WORKER_HEARTBEAT_FILE" -newermt "-30 seconds" | grep -q .

Settings: WORKER_HEARTBEAT_FILE (unset: no heartbeat, the default on one machine) and
WORKER_HEARTBEAT_INTERVAL (seconds between touches; the probe's age must exceed it a few times).
The file is removed when the worker stops, so a stopped worker is never reported alive.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from celery import bootsteps

__all__ = ["Heartbeat", "touch"]

log = logging.getLogger("tasks")


def touch(path: Path) -> None:
    """Create `path` (and its directory) or move its modification time to now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.utime(path)


class Heartbeat(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep: touch WORKER_HEARTBEAT_FILE every WORKER_HEARTBEAT_INTERVAL seconds
    from the worker's timer (the main process's event loop)."""

    requires = ("celery.worker.components:Timer",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        settings = worker.app.platform_settings
        self.path = Path(settings.worker_heartbeat_file) if settings.worker_heartbeat_file \
            else None
        self.interval = settings.worker_heartbeat_interval
        self.tref: Any = None
        super().__init__(worker, **kwargs)

    def include_if(self, worker: Any) -> bool:
        return self.path is not None

    def start(self, worker: Any) -> None:
        assert self.path is not None
        self._beat()
        self.tref = worker.timer.call_repeatedly(self.interval, self._beat)
        log.info("heartbeat: touching %s every %gs", self.path, self.interval)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def _beat(self) -> None:
        assert self.path is not None
        try:
            touch(self.path)
        except OSError as exc:  # a full or read-only disk: the probe will say so
            log.warning("heartbeat: cannot touch %s: %s", self.path, exc)
