"""A worker keeps the runner messages it holds counted, and lets them go when it lets go of them.

The reconciler counts a runner message it sent for RANGE_RUNNER_WAIT seconds (600 by default):
long enough for a message to wait its turn in a busy queue. Once a worker has received the
message, that wait is the wrong bound: the message can be lost with the worker (kill -9 while
it is prefetched; its redelivery waits for the broker's visibility timeout) or end without its
task body running (Celery fails a task whose STARTED state cannot be written, and acks it), and
for RANGE_RUNNER_WAIT the job would run with a runner fewer, or with none at all.

So the worker's main process takes the count over (`RunnerKeeper`, a worker bootstep on its own
timer, which ticks however busy the pool is):

    every LEASE_TTL / 2   the tokens of the run_partition requests the worker holds (reserved,
                          prefetched or running: `celery.worker.state.requests`) count for
                          `alive` seconds more (`RunnerSlots.held`: only tokens that still
                          count, so an ended runner is never brought back)
    a task failed         its token too, once (`PartitionRequest.on_failure` calls `failed`):
                          its message is gone, the token stops counting `alive` seconds later
    worker gone           no more ticks: its tokens stop counting `alive` seconds later, and
                          the reconciler sends runners in their place

A tick that cannot reach Redis keeps the failed tokens for the next one (at most MAX_FAILED).
"""

from __future__ import annotations

import logging
import weakref
from collections import defaultdict
from typing import Any

from celery import bootsteps
from celery.worker import state
from redis.exceptions import RedisError

from tasks.config.settings import settings_of
from tasks.ranges.runners import RunnerSlots
from tasks.ranges.settings import range_settings
from tasks.store.resources import resources_for

__all__ = ["RunnerKeeper", "failed", "held_tokens", "RUN_PARTITION"]

log = logging.getLogger("tasks.ranges")

RUN_PARTITION = "tasks.ranges.run_partition"
MAX_FAILED = 10_000  # failed tokens waiting for Redis; older ones stop counting by their score

_failed: dict[str, str] = {}  # token -> job, of tasks that failed since the last good tick
# Failed requests are never held again, even while Celery keeps them (a failure whose result
# write raised leaves its request in `state.requests`).
_failed_requests: weakref.WeakSet[Any] = weakref.WeakSet()


def runner_of(args: Any) -> tuple[str, str] | None:
    """(job, token) of run_partition arguments carrying a runner token, else None."""
    if (isinstance(args, (list, tuple)) and len(args) >= 3 and isinstance(args[0], str)
            and isinstance(args[2], str)):
        return args[0], args[2]
    return None


def failed(request: Any) -> None:
    """A run_partition `request` failed in this worker: count its token out soon."""
    found = runner_of(getattr(request, "args", None))
    if found is not None and len(_failed) < MAX_FAILED:
        _failed[found[1]] = found[0]
        _failed_requests.add(request)


def held_tokens(requests: Any) -> dict[str, set[str]]:
    """job -> runner tokens of the run_partition `requests`, and of the failed tasks."""
    tokens: dict[str, set[str]] = defaultdict(set)
    for request in requests:
        if getattr(request, "name", None) == RUN_PARTITION and request not in _failed_requests:
            found = runner_of(getattr(request, "args", None))
            if found is not None:
                tokens[found[0]].add(found[1])
    for token, job in _failed.items():
        tokens[job].add(token)
    return tokens


class RunnerKeeper(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep: every LEASE_TTL / 2, mark the runner tokens this worker holds."""

    requires = ("celery.worker.components:Timer",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self.settings = settings_of(worker.app)
        self.interval = self.settings.lease_ttl / 2
        self.tref: Any = None
        super().__init__(worker, **kwargs)

    def start(self, worker: Any) -> None:
        self.tref = worker.timer.call_repeatedly(self.interval, self.tick)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def tick(self) -> None:
        tokens = held_tokens(list(state.requests.values()))
        if not tokens:
            return
        ranges = range_settings(self.settings)
        client = resources_for(self.settings).redis
        try:
            for job, held in tokens.items():
                RunnerSlots(client, job, ranges.runners, wait=ranges.runner_wait,
                            alive=3 * self.settings.lease_ttl).held(sorted(held))
        except (RedisError, OSError) as exc:
            log.info("runner keeper: Redis away (%s); the next tick marks again",
                     type(exc).__name__)
            return
        _failed.clear()
