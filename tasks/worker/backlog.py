"""Queues you can see: how many messages wait in each of the platform's queues, and for how
long the oldest has waited.

Every task message this app publishes carries `sent_at` (a header, seconds since the epoch),
stamped by `before_task_publish`. On a Redis broker a queue is a list (kombu pushes on the left,
consumers pop on the right): its length is the backlog, and the message at its right end is the
oldest, whose `sent_at` gives its age; kombu's priority lists (`queue` + `\\x06\\x16` + step) are
counted with it. On RabbitMQ a passive declare gives the count; the age is not known (None).
Messages a worker has fetched and holds (prefetched or running) are no longer in the queue.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from celery.signals import before_task_publish

__all__ = ["Backlog", "queue_backlog", "SENT_AT", "PRIORITY_SEP", "PRIORITY_STEPS"]

SENT_AT = "sent_at"
# kombu's Redis transport: a queue's priority lists are named queue + separator + step.
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)


@dataclass(frozen=True)
class Backlog:
    """One queue: messages waiting in the broker, and the oldest one's age in seconds (None:
    empty, or a broker that does not tell)."""

    name: str
    messages: int | None
    oldest_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "messages": self.messages,
                "oldest_s": None if self.oldest_s is None else round(self.oldest_s, 1)}


@before_task_publish.connect
def _stamp_sent_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None and SENT_AT not in headers:
        headers[SENT_AT] = round(time.time(), 3)


def queue_backlog(app: Any, names: Iterable[str], now: float | None = None) -> list[Backlog]:
    """The backlog of each queue in `names` on `app`'s broker."""
    now = time.time() if now is None else now
    with app.connection_for_read() as conn:
        if conn.transport.driver_type == "redis":
            client = conn.default_channel.client
            return [_redis_backlog(client, name, now) for name in names]
        return [_counted(conn, name) for name in names]


def _redis_backlog(client: Any, name: str, now: float) -> Backlog:
    keys = [name, *(f"{name}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS)]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.llen(key)
    for key in keys:
        pipe.lindex(key, -1)
    replies = pipe.execute()
    counts, tails = replies[:len(keys)], replies[len(keys):]
    ages = [age for age in (_age(tail, now) for tail in tails) if age is not None]
    return Backlog(name, int(sum(counts)), max(ages) if ages else None)


def _age(raw: Any, now: float) -> float | None:
    """The age of a queued message from its `sent_at` header (None: none, or unreadable)."""
    if raw is None:
        return None
    try:
        sent = json.loads(raw).get("headers", {}).get(SENT_AT)
    except (ValueError, AttributeError, TypeError):
        return None
    return max(now - float(sent), 0.0) if isinstance(sent, int | float) else None


def _counted(conn: Any, name: str) -> Backlog:
    channel = conn.channel()  # a refused passive declare closes its channel: one per queue
    try:
        declared = channel.queue_declare(queue=name, passive=True)
    except conn.channel_errors:  # a queue never declared holds nothing yet
        return Backlog(name, 0, None)
    finally:
        try:
            channel.close()
        except conn.connection_errors + conn.channel_errors:
            pass
    return Backlog(name, int(declared.message_count), None)
