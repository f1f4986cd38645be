"""The control plane: control verbs and reconcile rounds never wait behind work.

A worker's pool runs one task per slot, and with acks-late and a prefetch of one per slot a
worker whose slots all hold long tasks (range partitions) fetches nothing more from the broker
until one ends. Before this step, a `pause` sent to the one worker of the quickstart layout
waited for a partition to finish (1m46s measured), and beat's reconcile rounds queued behind it.

`ControlPlane`, a consumer bootstep, takes CONTROL_QUEUE away from the worker's task consumer
(when the worker consumes it at all: `-Q` decides, as before) and consumes it on a channel of its
own, with its own prefetch, so its messages are fetched whatever the pool is doing. A task
declared with `control_plane=True` (the range controls and the reconcile round: short, bounded
by the database's lock timeout) runs in the worker's main process on one thread of the step's
own, in the order its messages came, through Celery's tracer (signals, result backend, retries
of the result write), and its message is acknowledged when it ends. Every other task on that
queue (rollback sweeps, health checks) goes to the pool exactly as before, through the same
strategy (size limits, ETA).

A periodic message for the pool (beat's rollback sweep: it carries `expires`) while another
of its task still waits for the pool or runs there is acknowledged and dropped, since the next
tick supersedes it. Without that, in the one-worker layout, sweeps waiting for a pool held by a
partition filled this channel's prefetch after PREFETCH ticks and no control arrived until the
partition's time slice ended (the pause test's failures on a loaded machine).

Order on the thread: a control verb runs before any periodic round waiting there (a task
declared `control_plane=ROUND`: beat's reconcile and schedule rounds), verbs in the order they
came, rounds likewise; a round is idempotent and the next one supersedes it. A message whose
`expires` passed while it waited on the thread is dropped there too, not only on arrival: on a
loaded machine rounds that take longer than their interval used to queue up to PREFETCH deep
ahead of a `pause` (30 s and more seen in a busy test run).

What is the same as in the pool: the task's result and its state in the result backend, the
refusal of an oversized message, JSON only. What differs: no soft or hard time limit (the task
is a few statements under the database's lock timeout), no task events for Flower, and a worker
killed before the ack leaves the message to be redelivered (acks-late, as in the pool). The
thread is fork-safe as the platform's other main-process threads are: a pool process made after
a fork drops every connection it inherited (`tasks.store.resources`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from celery import bootsteps
from celery.app.trace import trace_task_ret
from celery.worker.control import inspect_command

from tasks.config.settings import settings_of
from tasks.worker.limits import refuse_oversized

__all__ = ["ControlPlane", "PREFETCH", "ROUND", "Waiting", "runs_in_control_plane"]

log = logging.getLogger("tasks.worker.controlplane")

# Messages of the control queue fetched ahead of the one running: they run in order on one
# thread, so a few are enough; the rest wait in the broker, visible as its backlog.
PREFETCH = 8


# `control_plane=ROUND` on a task: a periodic round, run after any control verb waiting.
ROUND = "round"


def runs_in_control_plane(task: Any) -> bool:
    """Whether `task` (a registered Celery task) runs on the control plane's thread."""
    return bool(getattr(task, "control_plane", False))


class Waiting:
    """The control-plane messages waiting for the thread: verbs first, then rounds, each in
    the order they came."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Any, Any]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()

    def push(self, task: Any, message: Any) -> None:
        rank = 1 if getattr(task, "control_plane", None) == ROUND else 0
        with self._lock:
            heapq.heappush(self._heap, (rank, next(self._order), task, message))

    def pop(self) -> tuple[Any, Any]:
        with self._lock:
            _, _, task, message = heapq.heappop(self._heap)
        return task, message

    def __len__(self) -> int:
        return len(self._heap)


class ControlPlane(bootsteps.ConsumerStep):
    """Consume CONTROL_QUEUE on a channel of its own; run control-plane tasks in this process."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.queue_name: str | None = None
        self.executor: ThreadPoolExecutor | None = None
        self._to_pool: Any = None
        self._consumer: Any = None
        self._waiting = Waiting()
        self._for_pool: dict[str, Any] = {}  # task name -> its last periodic message sent there

    def start(self, c: Any) -> None:
        name = settings_of(c.app).control_queue
        task_consumer = c.task_consumer
        if task_consumer is None or name not in {q.name for q in task_consumer.queues}:
            return  # this worker does not consume the control queue (`-Q` left it out)
        task_consumer.cancel_by_queue(name)
        self.queue_name = name
        # A (re)start after a lost connection: the messages remembered here went with it and
        # are never acknowledged now; kept, they would drop every later sweep for good.
        self._for_pool.clear()
        self._consumer = c
        self._to_pool = c.create_task_handler()
        if self.executor is None:
            self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control")
        self.consumers = self.get_consumers(c.connection.channel())
        # Consume once the worker's event loop runs, as the task consumer does: a message that
        # arrived while the consumer's later steps still start (AMQP delivers on any channel
        # during another's handshake) would meet a consumer not ready to take it.
        if c.hub is not None:
            c.hub.call_soon(self._consume)
        else:
            self._consume()
        log.info("control plane: %s consumed on its own channel; controls and reconcile "
                 "rounds run in the main process", name)

    def get_consumers(self, channel: Any) -> list[Any]:
        c = self._consumer
        assert c is not None and self.queue_name is not None
        queue = c.app.amqp.queues[self.queue_name]
        return [c.app.amqp.TaskConsumer(channel, queues=[queue], on_message=self._on_message,
                                        on_decode_error=c.on_decode_error,
                                        prefetch_count=PREFETCH)]

    def _consume(self) -> None:
        for consumer in self.consumers or []:
            try:
                consumer.consume()
            except Exception as exc:  # the connection went meanwhile: its restart starts again
                log.warning("control plane: cannot consume %s yet (%s)", self.queue_name,
                            type(exc).__name__)

    def shutdown(self, c: Any) -> None:
        super().shutdown(c)
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None

    def _on_message(self, message: Any) -> None:
        """A message of the control queue, in the consumer's event loop."""
        c = self._consumer
        headers = message.headers if isinstance(message.headers, dict) else {}
        task = c.app.tasks.get(headers.get("task"))
        if (task is None or not runs_in_control_plane(task) or headers.get("eta")
                or self.executor is None):
            if not self._superseded(message, headers):
                self._to_pool(message)  # the pool's own path: unknown tasks, ETA, sweeps
            return
        if refuse_oversized(task, c.app, message):
            return
        if self._dropped_expired(task, message):
            return
        self._waiting.push(task, message)
        self.executor.submit(self._run_next)

    def _superseded(self, message: Any, headers: dict[str, Any]) -> bool:
        """Acknowledge and drop a periodic message for the pool (it carries `expires`, no
        ETA) while the last one of its task still waits for the pool or runs there."""
        name = headers.get("task")
        if not name or not headers.get("expires") or headers.get("eta"):
            return False
        earlier = self._for_pool.get(name)
        if earlier is not None and not earlier.acknowledged:
            log.debug("control plane: %s[%s] dropped: %s[%s] still waits for the pool", name,
                      headers.get("id"), name, earlier.headers.get("id"))
            message.ack_log_error(log, self._consumer.connection_errors)
            return True
        self._for_pool[name] = message
        return False

    def _dropped_expired(self, task: Any, message: Any) -> bool:
        """Acknowledge and drop `message` if its `expires` has passed."""
        headers = message.headers if isinstance(message.headers, dict) else {}
        if not _expired(headers.get("expires")):
            return False
        log.info("control plane: %s[%s] expired before it ran; dropped", task.name,
                 headers.get("id"))
        message.ack_log_error(log, self._consumer.connection_errors)
        return True

    def _run_next(self) -> None:
        """On this step's thread: the first waiting message (one per message submitted)."""
        task, message = self._waiting.pop()
        if not self._dropped_expired(task, message):
            self._run(task, message)

    def _run(self, task: Any, message: Any) -> None:
        """Run the task on this step's thread, then acknowledge its message."""
        c = self._consumer
        headers = dict(message.headers)
        properties = message.properties or {}
        delivery = message.delivery_info or {}
        request = {**headers, "hostname": c.hostname,
                   "reply_to": properties.get("reply_to"),
                   "correlation_id": properties.get("correlation_id") or headers.get("id"),
                   "delivery_info": {"exchange": delivery.get("exchange"),
                                     "routing_key": delivery.get("routing_key"),
                                     "priority": properties.get("priority"),
                                     "redelivered": delivery.get("redelivered")}}
        try:
            trace_task_ret(task.name, headers.get("id"), request, message.body,
                           message.content_type, message.content_encoding, app=c.app)
        except Exception:  # the tracer stores a task's own failure; this is the tracer's
            log.exception("control plane: %s[%s] could not run", task.name, headers.get("id"))
        finally:
            message.ack_log_error(log, c.connection_errors)


@inspect_command()
def active_queues(state: Any) -> list[dict[str, Any]]:
    """List the task queues a worker is currently consuming from (Celery's command of this
    name, which sees only the task consumer's, with the control plane's queue added: `celery
    inspect active_queues` and Flower go on showing what the worker consumes)."""
    consumer = state.consumer
    found = list(consumer.task_consumer.queues) if consumer.task_consumer else []
    for step in getattr(consumer, "steps", ()):
        if isinstance(step, ControlPlane) and step.queue_name is not None:
            found += [q for c in step.consumers or [] for q in c.queues]
    return [dict(queue.as_dict(recurse=True)) for queue in found]


def _expired(expires: Any) -> bool:
    if not expires:
        return False
    if not isinstance(expires, str):
        return False
    try:
        when = datetime.fromisoformat(expires)
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when < datetime.now(UTC)
