"""The Celery application: `celery -A tasks worker|beat|flower|call` all find it here.

The composition root: the app is built from the core and the wings `tasks.wings` enables (the
setting WINGS, default all; their task modules, settings sections, routing rules, beat entries,
metric series and dead-letter kinds). The configuration is the one DESIGN.md "Celery settings"
asks for; `configure` is a pure function of `Settings` (and the wings) so tests can read the
resulting configuration without a worker.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals
from celery.app import backends
from celery.app.task import Task as CeleryTask
from kombu import Exchange, Queue

from tasks import wings as composition
from tasks.config.redisconn import is_sentinel
from tasks.config.settings import Settings, SettingsError, redact
from tasks.deadletters import kinds
from tasks.observe.logs import use_json
from tasks.wing import Wing, each
from tasks.worker import (  # noqa: F401  (lifecycle, backlog: their signal handlers)
    backlog,
    brokerfix,
    flowerguard,
    heartbeat,
    lifecycle,
)
from tasks.worker.controlplane import ControlPlane
from tasks.worker.limits import bound_log_handlers, bounded_backend
from tasks.worker.queues import routing_config
from tasks.worker.retry import check_policy
from tasks.worker.schedule import beat_schedule

__all__ = ["app", "configure", "settings", "check_time_limits", "TASK_MODULES"]

log = logging.getLogger("tasks")

# The enabled wings only: a wing turned off (WINGS) brings no task module, queue, route, beat
# entry, metric series or dead-letter kind.
WINGS = composition.enabled()
# Named, never imported here (Celery imports them when the app is finalized): the core's and
# the wings' task modules (each wing's declaration), then the examples (the order saga stands
# on the rollback wing).
TASK_MODULES = [*composition.task_modules(WINGS),
                *(["tasks.examples.saga"] if any(w.name == "rollback" for w in WINGS) else [])]


def configure(settings: Settings, wings: tuple[Wing, ...] = WINGS) -> dict[str, Any]:
    """Return the Celery configuration for `settings` and `wings`."""
    visibility = {"visibility_timeout": settings.visibility_timeout}
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        # JSON only: a pickle payload is refused, never deserialized.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # At-least-once delivery; leases and fences make the second run a no-op.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # The visibility timeout must be set in all three places to take effect everywhere.
        "broker_transport_options": {**visibility, **redis_link_options(settings.broker_url),
                                     **sentinel_options(settings.broker_url, settings)},
        "result_backend_transport_options": {
            **visibility, **sentinel_options(settings.result_backend, settings)},
        "visibility_timeout": settings.visibility_timeout,
        **backend_link_options(settings.result_backend),
        "task_soft_time_limit": settings.soft_time_limit,
        "task_time_limit": settings.time_limit,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "task_track_started": True,
        # A result write (STARTED, a progress update, the result) that meets a Redis blip is
        # tried again: Celery fails a task whose STARTED write raised, and acks its message.
        **BACKEND_RETRY,
        "result_expires": 24 * 3600,
        "result_extended": True,
        "beat_scheduler": "beat.scheduler:LeaderScheduler",
        "beat_schedule": beat_schedule(settings, wings),
        "timezone": "UTC",
        "enable_utc": True,
        # Read by tasks.worker.limits on publish and on receipt.
        "max_message_bytes": settings.max_message_bytes,
        "worker_soft_shutdown_timeout": soft_shutdown_timeout(settings),
        # Partitions, restock work and controls on queues of their own (tasks/worker/queues.py);
        # every queue is declared, so a worker without -Q consumes them all.
        **routing_config(settings, wings),
    }


# Celery's result_backend_always_retry: about 5 s of tries with jittered exponential back-off
# (0.2 s doubling up to 2 s), then the error is the task's as before.
BACKEND_RETRY = {"result_backend_always_retry": True, "result_backend_max_retries": 6,
                 "result_backend_base_sleep_between_retries_ms": 200,
                 "result_backend_max_sleep_between_retries_ms": 2000}


# A worker's warm shutdown hands a running partition over at its next batch boundary; a batch
# heartbeats its lease, so it ends within LEASE_TTL or loses the lease anyway. The soft shutdown
# (Celery 5.5+, on SIGQUIT) gives tasks one batch plus this long for the handover (commit,
# release the lease, mark the partition pending) before the cold shutdown requeues the rest.
HANDOVER_SECONDS = 5.0


def soft_shutdown_timeout(settings: Settings) -> float:
    """`worker_soft_shutdown_timeout`: one batch (at most LEASE_TTL) plus the handover."""
    return settings.lease_ttl + HANDOVER_SECONDS


# A Redis link can die without a reset (a NAT or load balancer forgets it, the host vanishes).
# Without a socket timeout a synchronous call on it (a worker's late ack, a result write)
# waits for ever, and the worker's main process never consumes again; kombu's check of a
# BRPOP overdue by brpop_timeout + health_check_interval needs the event loop to run at all.
LINK_TIMEOUT_S = 5  # longer than any command the platform sends; BRPOP waits 1 s
LINK_CHECK_S = 5  # kombu's check of idle pub/sub and BRPOP connections, and redis-py's PING


def redis_link_options(url: str) -> dict[str, Any]:
    """Transport options that end a dead Redis broker link in bounded time (not for AMQP)."""
    if is_amqp(url):
        return {}
    return {"socket_timeout": LINK_TIMEOUT_S, "socket_connect_timeout": LINK_TIMEOUT_S,
            "socket_keepalive": True, "health_check_interval": LINK_CHECK_S}


def backend_link_options(url: str) -> dict[str, Any]:
    """The same bounds for a Redis result backend (Celery's redis_* settings)."""
    if url.split("://", 1)[0] not in ("redis", "rediss", "sentinel"):
        return {}
    return {"redis_socket_timeout": LINK_TIMEOUT_S,
            "redis_socket_connect_timeout": LINK_TIMEOUT_S, "redis_socket_keepalive": True,
            "redis_backend_health_check_interval": LINK_CHECK_S}


def sentinel_options(url: str, settings: Settings) -> dict[str, Any]:
    """The transport options a sentinel:// broker or result backend needs: the master's name
    (kombu and Celery ask the sentinels for that master and follow its failovers)."""
    return {"master_name": settings.sentinel_master} if is_sentinel(url) else {}


def is_amqp(url: str) -> bool:
    """True when `url` names a RabbitMQ (AMQP) broker."""
    return url.split("://", 1)[0] in ("amqp", "amqps", "pyamqp")


def quorum_queues(queues: Any, delivery_limit: int) -> tuple[Queue, ...]:
    """`queues` (Celery's `celery` queue when None) declared as RabbitMQ quorum queues with a
    delivery limit, each on a topic exchange of its own name (native delayed delivery, which
    carries countdowns and ETAs on quorum queues, refuses direct exchanges)."""
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": delivery_limit}
    found = []
    declared: Any = queues or (Queue("celery"),)
    for queue in declared:
        name = queue.name
        found.append(Queue(name, Exchange(queue.exchange.name or name, type="topic"),
                           routing_key=queue.routing_key or name,
                           queue_arguments={**(queue.queue_arguments or {}), **arguments}))
    return tuple(found)


def amqp_options(settings: Settings, queues: Any = None) -> dict[str, Any]:
    """What a RabbitMQ broker adds to the configuration: quorum queues with a delivery limit
    (AMQP_DELIVERY_LIMIT, above REDELIVERY_CAP) for the declared queues and for queues made on
    first use, on topic exchanges."""
    return {
        "task_queues": quorum_queues(queues, settings.amqp_delivery_limit),
        "task_default_exchange_type": "topic",
        "task_create_missing_queue_type": "quorum",
        "task_create_missing_queue_exchange_type": "topic",
    }


def check_time_limits(celery_app: Celery) -> None:
    """Refuse to start when a task's limits could outlive the visibility timeout.

    A task still running when the visibility timeout passes is redelivered to another worker
    while the first copy runs on, so every hard limit must stay below it, and every soft limit
    below its hard limit.
    """
    visibility = celery_app.conf.visibility_timeout
    for name, task in sorted(celery_app.tasks.items()):
        if name.startswith("celery."):
            continue
        hard = task.time_limit or celery_app.conf.task_time_limit
        soft = task.soft_time_limit or celery_app.conf.task_soft_time_limit
        if hard is None or hard >= visibility:
            raise SettingsError(
                f"task {name}: time limit {hard} must be below VISIBILITY_TIMEOUT ({visibility})"
            )
        if soft is not None and soft >= hard:
            raise SettingsError(
                f"task {name}: soft time limit {soft} must be below its time limit {hard}"
            )
        policy = getattr(task, "retry_policy", None)
        if policy is not None:
            check_policy(policy, visibility, name)


# Workers must survive a broker restart: see tasks/worker/brokerfix.py (kombu#970 family).
brokerfix.install()
# Flower refuses to start without auth and binds loopback, from any directory.
flowerguard.install()
settings = composition.load_settings()
# The wings' dead-letter kinds, with what to do instead of a replay (the CLI and console).
kinds.register(each(WINGS, "dead_letter_kinds"))
# MAX_MESSAGE_BYTES: checked on publish (the amqp class) and on receipt (every task's Strategy,
# also PlatformTask's and plain celery.Task's).
CeleryTask.Strategy = "tasks.worker.limits:strategy"


class PlatformCelery(Celery):  # type: ignore[misc]
    """Celery whose result backend stores no long strings (`tasks.worker.limits.bounded_backend`),
    carrying the platform's settings and wings for the core code the app imports (which cannot
    import it back: `tasks.config.settings.settings_of`)."""

    platform_settings: Settings | None = None
    platform_wings: tuple[Wing, ...] = ()

    def _get_backend(self) -> Any:
        # Celery's own `_get_backend`, with the class wrapped: `backend_cls` cannot carry the
        # URL, and a "module:Class+url" result_backend would change the URL users set.
        backend_cls, url = backends.by_url(self.backend_cls or self.conf.result_backend,
                                           self.loader)
        return bounded_backend(backend_cls)(app=self, url=url)


app = PlatformCelery("tasks", amqp="tasks.worker.limits:LimitedAMQP",
             include=TASK_MODULES + list(settings.extra_task_modules))
app.conf.update(configure(settings))
if is_amqp(settings.broker_url):
    app.conf.update(amqp_options(settings, app.conf.task_queues))
app.platform_settings = settings
app.platform_wings = WINGS
# Liveness without a queued task: WORKER_HEARTBEAT_FILE, touched from the worker's own timer.
app.steps["worker"].add(heartbeat.Heartbeat)
# Controls and reconcile rounds never wait behind work (tasks/worker/controlplane.py).
app.steps["consumer"].add(ControlPlane)


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _bound_log_lines(logger: logging.Logger, **_: Any) -> None:
    # No log line quotes more than a short part of a large value (MAX_MESSAGE_BYTES).
    bound_log_handlers(logger)
    if settings.log_format == "json":
        use_json(logger)


@app.on_after_finalize.connect
def _validate_on_finalize(sender: Celery, **_: Any) -> None:
    check_time_limits(sender)
    log.debug(
        "platform configured: broker=%s database=%s",
        redact(settings.broker_url),
        redact(settings.database_url),
    )
