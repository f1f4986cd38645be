"""`PlatformTask`: the task base class of the platform.

    @app.task(base=PlatformTask, retry_policy=EXPONENTIAL, soft_time_limit=50, time_limit=60,
              schedule_to_start=30)
    def charge(order_id: str) -> None: ...

What it adds to a plain Celery task, and what each costs on the hot path:

- **Retry policies** (`tasks.worker.retry`): an exception the policy retries is retried with the
  policy's jittered countdown; everything else fails at once. No I/O unless it retries.
- **Redelivery cap**: with `task_reject_on_worker_lost`, a message that kills its worker is
  redelivered forever. A redelivered message increments `deliveries:{task_id}` in Redis; past
  `REDELIVERY_CAP` deliveries it goes to the dead-letter store instead of running again. A first
  delivery (the common case) does no I/O at all.
- **Soft time limit**: the task's rollback runs (and its journal lease is released) before
  Celery records the failure; `SoftTimeLimitExceeded` is re-raised, never swallowed.
- **Hooks** (`TaskHooks`): a wing that keeps state per execution installs hooks when it is
  imported; the core names no wing. The rollback wing's: only a PlatformTask may record
  checkpoints; when it returns, its journal is settled before Celery stores the result, and
  if the journal was taken over meanwhile (its lease lost, the sweeper undoing its steps), the
  task fails with `JournalLost` instead of succeeding. `JournalLost` is never retried. No I/O
  for a task that recorded nothing, none at all in a process that installed no hooks.
- **Schedule-to-start limit**: `schedule_to_start` seconds become the message's `expires`, so
  a task that waited too long in the queue is revoked (state REVOKED, reason "expired")
  instead of started.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore, SoftTimeLimitExceeded
from celery.utils.quorum_queues import detect_quorum_queues

from tasks.config.settings import settings_of
from tasks.deadletters.kinds import TASK_KIND
from tasks.observe.metrics import record
from tasks.worker.keys import deliveries_key
from tasks.worker.retry import RetryPolicy, decide

__all__ = ["PlatformTask", "DEAD_LETTERED", "TaskHooks", "deliveries_key", "install_hooks"]

log = logging.getLogger("tasks")

# Custom state of a task whose message was dead-lettered instead of run.
DEAD_LETTERED = "DEAD_LETTERED"

# deliveries:{TASK_ID} (tasks.worker.keys) -> how many times a redelivered message was delivered
# after the first. TTL: twice the visibility timeout (a message cannot be redelivered later
# than that). Owner: PlatformTask.__call__.


@dataclass(frozen=True)
class TaskHooks:
    """What a wing adds to every PlatformTask run, installed with `install_hooks` when the
    wing is imported (the rollback wing installs its journal's). Each runs in the task's
    process, in the order installed."""

    # The task returned normally, before Celery stores its result: raise to fail it instead
    # (a task whose journal was taken over is never SUCCESS).
    settle: Callable[[Task], None]
    # (task_id, reason): the soft time limit hit; undo now, before Celery records the failure
    # (what it returns is ignored).
    roll_back_now: Callable[[str, str], object]
    # Exceptions no retry policy may retry: the execution lost what it ran under.
    never_retried: tuple[type[BaseException], ...] = ()


_hooks: list[TaskHooks] = []


def install_hooks(hooks: TaskHooks) -> None:
    """Run `hooks` in every PlatformTask of this process from now on (once, however often it
    is installed)."""
    if hooks not in _hooks:
        _hooks.append(hooks)


def _never_retried(exc: BaseException) -> bool:
    return any(isinstance(exc, hooks.never_retried) for hooks in _hooks)


class PlatformTask(Task):  # type: ignore[misc]
    """Celery Task with retry policies, a redelivery cap, rollback on the soft limit and a
    schedule-to-start limit."""

    abstract = True
    acks_late = True
    reject_on_worker_lost = True
    # Retries are decided by `retry_policy` (None: never retried automatically).
    retry_policy: ClassVar[RetryPolicy | None] = None
    max_retries = None
    schedule_to_start: ClassVar[float | None] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.id and (request.delivery_info or {}).get("redelivered"):
            self._count_delivery(request.id, args, kwargs)
        try:
            result = self.run(*args, **kwargs)
        except SoftTimeLimitExceeded:
            self._roll_back_now(request.id, "soft time limit exceeded")
            raise
        except Exception as exc:
            policy = self.retry_policy
            countdown = decide(policy, exc, request.retries) if policy is not None else None
            if countdown is None or _never_retried(exc):
                raise
            raise self.retry(exc=exc, countdown=self._deliverable(countdown)) from exc
        for hooks in _hooks:
            hooks.settle(self)  # raises JournalLost: the task fails, never SUCCESS
        return result

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        if self.schedule_to_start is not None:
            options.setdefault("expires", self.schedule_to_start)
        return super().apply_async(args, kwargs, **options)

    def _deliverable(self, countdown: float) -> float:
        """`countdown` as the broker can delay it. On RabbitMQ quorum queues Celery delays a
        message by native delayed delivery, in whole seconds, and refuses a countdown below one
        (kombu's calculate_routing_key): there it is rounded up to a whole second."""
        if countdown <= 0:
            return countdown
        with self.app.connection_for_write() as conn:  # no I/O: the transport's kind only
            driver = conn.transport.driver_type
        if not detect_quorum_queues(self.app, driver)[0]:
            return countdown
        return float(max(1, math.ceil(countdown)))

    def _count_delivery(self, task_id: str, args: Any, kwargs: Any) -> None:
        from tasks.deadletters.store import DeadLetters
        from tasks.store.resources import resources_for

        settings = settings_of(self.app)
        res = resources_for(settings)
        key = deliveries_key(task_id)
        with res.redis.pipeline() as pipe:
            pipe.incr(key)
            pipe.expire(key, 2 * settings.visibility_timeout)
            redeliveries = int(pipe.execute()[0])
        deliveries = redeliveries + 1
        if deliveries <= settings.redelivery_cap:
            log.warning("task %s[%s]: delivery %d of at most %d", self.name, task_id,
                        deliveries, settings.redelivery_cap)
            return
        reason = (f"delivered {deliveries} times (REDELIVERY_CAP={settings.redelivery_cap}): "
                  "the message keeps killing its worker")
        DeadLetters(res.sessions).add(TASK_KIND, task_id, reason,
                                      {"task": self.name, "args": args, "kwargs": kwargs})
        if record.on is not None:
            record.on.task_capped.labels(self.name).inc()
        self.update_state(state=DEAD_LETTERED, meta={"reason": reason})
        raise Ignore(reason)

    @staticmethod
    def _roll_back_now(task_id: str | None, reason: str) -> None:
        if not task_id:
            return
        for hooks in _hooks:
            hooks.roll_back_now(task_id, reason)
