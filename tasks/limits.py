"""A size limit on task messages (issue 9 item 15): MAX_MESSAGE_BYTES.

- **On publish** (`LimitedAMQP`, the app's `amqp` class): every message this app sends, through
  `apply_async`, `send_task`, `celery -A tasks call` or beat, is measured as the JSON body the
  broker would get; a larger one raises `MessageTooLarge` before anything reaches the broker.
- **On receipt** (`strategy`, the `Strategy` of every task): a message from another producer
  that is larger is not decoded nor run. Its task fails with `MessageTooLarge` in the result
  backend, a dead letter (kind `oversized-message`) keeps its task name, id, size and a short
  prefix, and the message is acknowledged: it would be refused again on every redelivery.

Every message quotes at most a short prefix of the value (`tasks.validate.quote`), so a 1 MB
argument never becomes a 1 MB error, result, dead letter or log line.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.app.amqp import AMQP
from celery.worker.strategy import default as default_strategy
from kombu.utils.json import dumps

from tasks.validate import InvalidArguments, quote

__all__ = ["MessageTooLarge", "LimitedAMQP", "strategy", "OVERSIZED_KIND", "check_size"]

log = logging.getLogger("tasks.limits")

# Dead-letter kind of a message refused on receipt for its size.
OVERSIZED_KIND = "oversized-message"


class MessageTooLarge(InvalidArguments):
    """A task message exceeds MAX_MESSAGE_BYTES; it was not sent (or not run)."""


def _limit(app: Any) -> int:
    limit: int = app.conf.get("max_message_bytes") or 0
    return limit


def check_size(name: str, size: int, limit: int, sample: Any) -> None:
    """Raise `MessageTooLarge` when `size` exceeds `limit` (0: no limit)."""
    if limit and size > limit:
        raise MessageTooLarge(
            f"task {quote(name)}: message of {size:,} bytes exceeds MAX_MESSAGE_BYTES "
            f"({limit:,}); arguments start {quote(sample)}")


class LimitedAMQP(AMQP):  # type: ignore[misc]
    """Celery's AMQP with the publish-side size check."""

    def _create_task_sender(self) -> Any:
        send = super()._create_task_sender()
        app = self.app

        def send_task_message(producer: Any, name: str, message: Any, *args: Any,
                              **kwargs: Any) -> Any:
            limit = _limit(app)
            if limit:
                body = message.body
                check_size(name, len(dumps(body)), limit, body[:2] if isinstance(
                    body, tuple) else body)
            return send(producer, name, message, *args, **kwargs)

        return send_task_message


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Any:
    """Celery's default strategy, refusing oversized messages before they are decoded."""
    handler = default_strategy(task, app, consumer, **kwargs)
    limit = _limit(app)

    def task_message_handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any,
                             **more: Any) -> Any:
        raw = message.body
        size = len(raw) if isinstance(raw, bytes | str) else 0
        if limit and size > limit:
            _refuse(task, app, message, size, limit)
            return None
        return handler(message, body, ack, reject, callbacks, **more)

    return task_message_handler


def _refuse(task: Any, app: Any, message: Any, size: int, limit: int) -> None:
    headers = message.headers or {}
    task_id = str(headers.get("id") or "")
    raw = message.body
    prefix = raw[:64] if isinstance(raw, bytes | str) else b""
    try:
        check_size(task.name, size, limit, prefix)
    except MessageTooLarge as exc:
        error = exc
    log.error("refused task %s[%s]: %s", task.name, task_id, error)
    try:
        from tasks.app import settings
        from tasks.deadletter import DeadLetters
        from tasks.resources import resources_for

        DeadLetters(resources_for(settings).sessions).add(
            OVERSIZED_KIND, task_id or task.name, str(error),
            {"task": task.name, "bytes": size, "prefix": quote(prefix)})
        if task_id:
            task.backend.mark_as_failure(task_id, error)
    finally:
        message.ack()
