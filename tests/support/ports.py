"""Loopback ports for the tests' own servers (redis-server, cluster nodes, sentinels, proxies,
metrics and console ports), chosen below the kernel's ephemeral range.

A port the kernel hands out for `bind(0)` is an ephemeral port: closed again, it can be taken
by any outgoing connection's local end before the server the test starts binds it (on a busy
machine, with hundreds of connections to Redis and the databases, that happens: the server
exits with "Address already in use" and the test sees "connection refused"). Below the
ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`) no connection takes a port, so a
port that is free when chosen stays free for the server unless another test chooses it too:
each process walks the range from its own random start and never gives a port twice.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "cluster_port", "BUS_OFFSET"]

BUS_OFFSET = 10_000  # a Redis Cluster node's bus port is its port + 10000
_LOW = 10_000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


_HIGH = _ephemeral_low()
_given: set[int] = set()
_rng = random.SystemRandom()


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick(low: int, high: int, *offsets: int) -> int:
    for _ in range(2000):
        port = _rng.randrange(low, high)
        wanted = [port + o for o in (0, *offsets)]
        if any(p in _given for p in wanted) or not all(_bindable(p) for p in wanted):
            continue
        _given.update(wanted)
        return port
    raise RuntimeError(f"no free loopback port in {low}..{high}")


def free_port() -> int:
    """A free loopback port below the ephemeral range (20000 and up)."""
    return _pick(2 * _LOW, _HIGH)


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below the ephemeral
    range."""
    return _pick(_LOW, _HIGH - BUS_OFFSET, BUS_OFFSET)
