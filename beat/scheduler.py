"""A beat scheduler that ticks only while it holds the `beat:leader` lease.

Run two beats (`celery -A tasks beat`, twice) and only the leader emits; the other tries to
take the lease every third of a TTL, so it takes over within one TTL after the leader dies.
Timeline of a failover (TTL 2 s):

    t0    beat A acquires beat:leader (fence 4) and ticks; beat B is refused and waits
    t1    A is killed; its lease is no longer renewed
    t1+2  the lease expires; B's next try (at most TTL/3 later) acquires it (fence 5), B ticks

Even if a paused ex-leader emitted one more round, the reconciler's term compare-and-set on its
schedule row keeps that round from running twice.

Liveness: every tick, the leader's and the standby's alike (at most TTL/3 apart), touches
WORKER_HEARTBEAT_FILE when it is set, as a worker's main process does (tasks/worker/heartbeat.py):
the probe reads the file's age, so it fails when this loop hangs or dies, not when Redis is away
(a standby that cannot reach Redis still ticks). The file is removed when beat stops.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from celery.beat import Scheduler
from redis.exceptions import RedisError

from lease import Lease, LeaseLost, NotAcquired, NotHeld
from tasks.observe.state import set_leader
from tasks.worker.heartbeat import touch
from tasks.worker.keys import BEAT_LEADER

__all__ = ["LEADER_LEASE", "LeaderScheduler", "QuietTicks"]

log = logging.getLogger("beat")

LEADER_LEASE = BEAT_LEADER
# Celery logs every task beat sends at INFO; the platform's own ticks (reconcile rounds, restock
# ticks, sweeps: every few seconds) would be three lines every 5 s. Entries that repeat at least
# this often are logged at DEBUG only; a user's nightly schedule still shows at INFO.
QUIET_EVERY_S = 60.0
SENDING = "Scheduler: Sending due task %s (%s)"  # celery.beat's message for a sent entry


class QuietTicks(logging.Filter):
    """Drops celery.beat's "Sending due task" lines of frequent entries unless DEBUG is on."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__()
        self.scheduler = scheduler

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != SENDING or not record.args or record.levelno > logging.INFO:
            return True
        if logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return True
        assert isinstance(record.args, tuple)
        entry = self.scheduler.schedule.get(str(record.args[0]))
        every = getattr(getattr(entry, "schedule", None), "run_every", None)
        return every is None or every.total_seconds() > QUIET_EVERY_S


class LeaderScheduler(Scheduler):
    """An in-memory `celery.beat.Scheduler` gated by a lease (no schedule file on disk)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from tasks.celery import settings
        from tasks.store.resources import resources_for

        self.lease_ttl = settings.lease_ttl
        self._leases = resources_for(settings).leases
        self._lease: Lease | None = None
        self._alive = Path(settings.worker_heartbeat_file) if settings.worker_heartbeat_file \
            else None
        super().__init__(*args, **kwargs)
        logging.getLogger("celery.beat").addFilter(QuietTicks(self))

    def tick(self, *args: Any, **kwargs: Any) -> float:
        wait = self.lease_ttl / 3
        self._heartbeat()
        if not self._lead():
            return wait
        assert self._lease is not None
        self._lease.heartbeat()
        return min(float(super().tick(*args, **kwargs)), wait)

    def _lead(self) -> bool:
        if self._lease is not None:
            try:
                self._lease.check()
                return True
            except LeaseLost:
                log.warning("beat: lost the leader lease; standing by")
                self._lease = None
                set_leader(False)
        try:
            self._lease = self._leases.acquire(LEADER_LEASE, ttl=self.lease_ttl)
        except NotAcquired:
            return False
        except RedisError as exc:
            log.warning("beat: cannot reach Redis for the leader lease (%s)", type(exc).__name__)
            return False
        log.info("beat: became leader (fence %d)", self._lease.fence)
        set_leader(True)  # the leader alone serves the shared state's metrics
        return True

    def _heartbeat(self) -> None:
        if self._alive is None:
            return
        try:
            touch(self._alive)
        except OSError as exc:  # a full or read-only disk: the probe will say so
            log.warning("beat: cannot touch %s: %s", self._alive, exc)

    def close(self) -> None:
        set_leader(False)
        if self._alive is not None:
            self._alive.unlink(missing_ok=True)
        if self._lease is not None:
            try:
                self._lease.release()
            except (LeaseLost, NotHeld, RedisError):
                pass
            self._lease = None
        super().close()
