"""The second broker of the matrix: RabbitMQ, one fresh virtual host per test.

The Redis broker needs nothing here (every real-worker test starts on it). A RabbitMQ test gets
`amqp://guest:guest@HOST/VHOST` on a vhost made for it with `rabbitmqctl` and deleted after, so
queues left by one test (or by another helper on the same server) never reach the next.
RabbitMQ itself is reached at TEST_AMQP_HOST (default 127.0.0.1:5672); CI starts it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from celery import Celery

from tasks.celery import amqp_options, configure, is_amqp
from tasks.wings import load_settings

__all__ = ["AMQP_HOST", "platform_client", "rabbitmq_missing", "rabbit_vhost"]

AMQP_HOST = os.environ.get("TEST_AMQP_HOST", "127.0.0.1:5672")


def _rabbitmqctl() -> str | None:
    return shutil.which("rabbitmqctl") or shutil.which("rabbitmqctl", path="/usr/sbin:/sbin")


def rabbitmq_missing() -> str | None:
    """Why RabbitMQ tests cannot run here, or None when they can."""
    if _rabbitmqctl() is None:
        return "rabbitmqctl is not installed (RabbitMQ tests need a local RabbitMQ server)"
    host, _, port = AMQP_HOST.partition(":")
    try:
        socket.create_connection((host, int(port or 5672)), timeout=2).close()
    except OSError as exc:
        return f"RabbitMQ does not answer on {AMQP_HOST} ({exc})"
    return None


def _ctl(*args: str) -> None:
    ctl = _rabbitmqctl()
    assert ctl is not None
    done = subprocess.run([ctl, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stderr or done.stdout}")


@contextmanager
def rabbit_vhost(prefix: str = "rk_test") -> Iterator[str]:
    """A fresh vhost for the guest user; yields its AMQP URL and deletes the vhost after."""
    vhost = f"{prefix}_{uuid.uuid4().hex[:10]}"
    _ctl("add_vhost", vhost)
    try:
        _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@{AMQP_HOST}/{vhost}"
    finally:
        _ctl("delete_vhost", vhost)


def platform_client(env: Mapping[str, str]) -> Celery:
    """A Celery client (not the platform's app) for the platform that `env` configures,
    routing and declaring its queues as the platform does (on RabbitMQ: quorum queues on topic
    exchanges; a client declaring them otherwise is refused with PRECONDITION_FAILED)."""
    settings = load_settings(env)
    client = Celery(set_as_current=False)
    client.conf.update(configure(settings))  # the platform's queues and routes too
    if is_amqp(settings.broker_url):
        client.conf.update(amqp_options(settings, client.conf.task_queues))
    return client
