"""A pool process's death frees its partitions at once: its worker's main process hands them back.

A prefork pool process that dies (the OOM killer's SIGKILL, a segfault) runs no handler of its
own, so its partitions used to wait for their leases to lapse (LEASE_TTL) and for the next
reconcile round. Its worker's main process learns of the death at once: billiard sees the
process's sentinel and fails the job it was running with `WorkerLostError`, in the main
process, through the task's request (`celery.worker.request.Request.on_failure`). Celery sends
no `task_failure` then (with `task_reject_on_worker_lost` the message is requeued), and
`worker_process_shutdown` runs only in a child that exits by itself; so `run_partition` carries
a request class of its own, `PartitionRequest`, whose `on_failure` hands the partitions back
before Celery requeues the message.

Timeline (worker a@h, pool process 4242, LEASE_TTL 10)::

    t0     4242 holds partition 7 of cm_data (fence 12) and is mid-batch; SIGKILL. Its open
           transaction dies with its connection (SQLite's lock with its process)
    t0+e   a@h's main process, WorkerLostError for run_partition(cm_data, 7) on pid 4242:
           1. one transaction: cm_data's rows `running` with owner 'a@h:4242' -> pending,
              fence 12 kept, one crash counted (`workrow.hand_back_dead`). From here on no
              write of 4242 matches: each needs `running` and fence 12
           2. Leases.revoke('range:cm_data:7', 12): the lease ends if it is still fence 12's
           3. offered to running holders (`range-orphans:{cm_data}`, `tasks.ranges.gate`)
              and dispatched again (run_partition(cm_data, 7))
    t0+d   a free worker acquires the lease (fence 13), claims the row (12 < 13) and resumes
           at the checkpoint: the takeover takes about one batch, not the TTL

Each step is fenced, so it is right whatever happened meanwhile: a row another holder claimed
no longer matches, a lease acquired since has a newer fence and is kept. If the main process
dies too (a whole host), or Redis or the database is away, nothing is handed back here and the
lease TTL plus one reconcile interval bound the takeover, as before. A process that died
between its lease's acquire and its claim owns no row yet: that partition waits for the TTL.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery import bootsteps
from celery.signals import worker_ready
from celery.worker.request import Request
from sqlalchemy.orm import Session, sessionmaker

from lease import Leases
from tasks.config.settings import Settings, settings_of
from tasks.ranges import keeper
from tasks.ranges.keys import range_lease_name, range_orphans_key
from tasks.ranges.runs import writing
from tasks.ranges.workrow import hand_back_dead
from tasks.store.db import utcnow
from tasks.store.resources import resources_for

__all__ = ["POOL_WATCH_S", "PartitionRequest", "PoolWatch", "hand_back", "holder_name",
           "orphan_ttl"]

log = logging.getLogger("tasks.ranges")

# How often the worker's main process looks for pool processes that exited (seconds).
POOL_WATCH_S = 0.25


def holder_name(hostname: str, pid: int) -> str:
    """The `owner` a pool process writes in the work rows it claims: its worker's node name
    and its pid. The main process finds a dead child's rows by it."""
    return f"{hostname}:{pid}"


def orphan_ttl(settings: Settings) -> int:
    """How long the orphans set lives: twice the reconciler's grace, as the reconciler sets."""
    grace = max(settings.lease_ttl, 2 * settings.reconcile_interval)
    return max(int(2 * grace), 1)


def hand_back(sessions: sessionmaker[Session], leases: Leases, client: redis.Redis, job: str,
              owner: str, note: str, ttl: int) -> list[int]:
    """Hand back the partitions of `job` the dead process `owner` held (see the module's
    timeline, steps 1 to 3 but the dispatch); returns them. `ttl`: the orphans set's."""
    # It reads the dead holder's rows, then writes them: on SQLite the write lock is taken
    # up front (`writing`), or a write committed between the two (a reconcile round, another
    # holder's batch) fails the upgrade at once with "database is locked" under WAL, and the
    # partitions wait for the lease TTL.
    with writing(sessions) as session:
        handed = hand_back_dead(session, job, owner, note)
    if not handed:
        return []
    for part, fence in handed:
        leases.revoke(range_lease_name(job, part), fence)
    parts = [part for part, _ in handed]
    with client.pipeline(transaction=False) as pipe:
        pipe.sadd(range_orphans_key(job), *parts)
        pipe.expire(range_orphans_key(job), ttl)
        pipe.execute()
    return parts


class PartitionRequest(Request):  # type: ignore[misc]
    """`run_partition`'s request in the worker's main process: when the pool process running
    it died, its partitions are handed back before Celery requeues the message; when the task
    failed, its runner token stops counting soon (`tasks.ranges.keeper`)."""

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> Any:
        if self.worker_pid and _died(exc_info.exception):
            self._hand_back(exc_info.exception)
        keeper.failed(self)  # a runner's message is gone: its slot frees soon
        return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                  return_ok=return_ok)

    def _hand_back(self, exc: BaseException) -> None:
        """Best effort: whatever fails here leaves the partitions to the lease TTL."""
        args = self.args
        if not (isinstance(args, (list, tuple)) and args and isinstance(args[0], str)):
            return
        job, owner = args[0], holder_name(self.hostname, self.worker_pid)
        started = time.monotonic()
        note = (f"pool process {self.worker_pid} died ({_cause(exc)}); handed back by its "
                f"worker at {utcnow():%H:%M:%S} UTC")
        try:
            settings = settings_of(self.task.app)
            res = resources_for(settings)
            parts = hand_back(res.sessions, res.leases, res.redis, job, owner, note,
                              orphan_ttl(settings))
            for part in parts:
                self.task.apply_async((job, part))
        except Exception as exc_here:  # Redis, the database or the broker away: the TTL path
            log.warning("range %s: pool process %s died; could not hand its partitions back "
                        "(%s): they wait for their leases to lapse", job, self.worker_pid,
                        type(exc_here).__name__)
            return
        if parts:
            log.warning("range %s: pool process %s died; handed back parts %s in %.3f s",
                        job, self.worker_pid, parts, time.monotonic() - started)


class PoolWatch(bootsteps.StartStopStep):  # type: ignore[misc]
    """Reap exited pool processes every POOL_WATCH_S seconds, on the worker's timer.

    The prefork pool learns of a child's exit from the child's sentinel pipe in its event loop,
    and otherwise from `maintain_pool` on a 5-second timer. Measured here (`bench failover`,
    a SIGKILLed pool process), the sentinel missed about half the deaths, so the worker saw
    the death, and `PartitionRequest` handed the partitions back, 4.2-4.6 s late.
    `maintain_pool` asks each child's exit code without blocking (waitpid WNOHANG): a few
    microseconds per child, so running it four times a second bounds that delay cheaply.
    """

    requires = ("celery.worker.components:Pool", "celery.worker.components:Timer")

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        pool = getattr(worker.pool, "_pool", None)  # billiard's pool (prefork only)
        if pool is not None and hasattr(pool, "maintain_pool"):
            self.tref = worker.timer.call_repeatedly(POOL_WATCH_S, pool.maintain_pool)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None


@worker_ready.connect
def _warm_up(sender: Any = None, **_: Any) -> None:
    """Open the main process's Redis and database connections when the worker starts, so a
    hand-back costs its round trips, not two connects (0.6 s on a loaded 2-core machine).
    The pool processes forked later forget them (`tasks.store.resources`); a connection that
    went stale meanwhile is replaced on checkout (pool_pre_ping)."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        res = resources_for(settings_of(app))
        res.redis.ping()
        with res.engine.connect():
            pass
    except Exception as exc:  # a hand-back would connect then, or leave it to the TTL
        log.info("range hand-back: connections not warmed (%s)", type(exc).__name__)


def _died(exc: BaseException) -> bool:
    """Whether `exc` says the pool process running the task is gone (billiard's report)."""
    if isinstance(exc, ExceptionWithTraceback):
        exc = exc.exc
    return isinstance(exc, WorkerLostError)


def _cause(exc: BaseException) -> str:
    if isinstance(exc, ExceptionWithTraceback):
        exc = exc.exc
    return str(exc)[:160]
