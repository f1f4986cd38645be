"""A workaround for a kombu defect that makes every busy worker exit when the broker Redis
restarts (the family of celery/kombu#970 and #582, still in kombu 5.7.0).

What happens (a prefork worker holding an unacknowledged acks_late message while its consumer
waits in BRPOP for the next one; the Redis broker goes away):

1. Celery's consumer sees the connection error and calls `Connection.collect()`. Closing the
   default channel fails half-way (its pending BRPOP read raises ConnectionError, which kombu
   ignores), and `collect()` then drops the transport's `client` anyway.
2. Celery then calls `Connection.close()`, which closes the same channel again. The channel
   now tries to restore its unacknowledged message, builds a new Redis pool from
   `transport.client`, which is None, and raises
   `AttributeError: 'NoneType' object has no attribute 'hostname'`.
3. Only connection errors are ignored there: the AttributeError reaches the worker's
   blueprint, which logs "Unrecoverable error" and exits.

The patch makes a kombu Redis channel whose transport is already gone raise a redis
`ConnectionError` instead of the AttributeError. Celery and kombu treat that as the
connection loss it is: the close finishes, the consumer reconnects, and the message stays in
kombu's unacked hash in Redis (restored by kombu's visibility-timeout restore if Redis kept it,
exactly as when the first close succeeds while Redis is down). Work itself never depends on that
redelivery: leases and the reconciler hand partitions on (DESIGN.md).

A second defect wedges a worker whose broker link dies without a reset (a NAT or load balancer
forgot it, found by the randomized fault run): the late ack of a finished task times out (the
socket timeout set in tasks/celery.py), Celery logs "Couldn't ack", and kombu's Redis QoS keeps
the message as delivered because its ack removes it only after the Redis write. With
prefetch 1 a slot is gone for each such ack; once all are gone the consumer never issues
BRPOP again, so kombu's check of an overdue BRPOP never runs and the worker is silent for good.
`_released_on_link_loss` lets the ack or reject that fails on a connection error give the
slot back before it re-raises: the message stays in the unacked hash in Redis and kombu's
visibility-timeout restore redelivers it, as after any lost connection.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["install", "TransportGone"]

_PATCHED = "__rangekeeper_patched__"


class TransportGone(RedisConnectionError):
    """A kombu Redis channel was used after its connection had been collected."""


def _guarded_connparams(original: Any) -> Any:
    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        transport = self.connection
        if transport is None or transport.client is None:
            raise TransportGone("the broker connection was already closed after a "
                                "connection loss (kombu#970 workaround)")
        return original(self, asynchronous=asynchronous)

    _connparams.__wrapped__ = original  # type: ignore[attr-defined]
    return _connparams


def _released_on_link_loss(original: Any) -> Any:
    def settle(self: Any, delivery_tag: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, delivery_tag, *args, **kwargs)
        except self.channel.connection_errors:
            # Only the local slot: Redis still holds the message, to be restored when visible.
            kombu_virtual.QoS.ack(self, delivery_tag)
            raise

    setattr(settle, _PATCHED, True)
    return settle


def install() -> None:
    """Patch kombu's Redis channel and QoS once per process (idempotent)."""
    channel = kombu_redis.Channel
    if getattr(channel._connparams, "__wrapped__", None) is None:
        setattr(channel, "_connparams", _guarded_connparams(channel._connparams))  # noqa: B010
    qos = kombu_redis.QoS
    for name in ("ack", "reject"):
        if not getattr(getattr(qos, name), _PATCHED, False):
            setattr(qos, name, _released_on_link_loss(getattr(qos, name)))
