"""Blocking acquire: woken by the release, bounded by the holder's TTL, no polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from lease import Lease, Leases, NotAcquired
from tests.lease.conftest import RoundTrips


def test_release_wakes_a_waiter_at_once(leases: Leases, monkeypatch: pytest.MonkeyPatch) -> None:
    holder = leases.acquire("b", ttl=5.0)
    got: list[tuple[Lease, float]] = []

    def waiter() -> None:
        lease = leases.acquire("b", ttl=5.0, blocking=True, timeout=4.0)
        got.append((lease, time.monotonic()))

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)
    trips = RoundTrips(leases, monkeypatch)
    released = time.monotonic()
    holder.release()
    thread.join(2.0)
    lease, woke = got[0]
    assert woke - released < 0.2  # well before the holder's 5 s TTL
    assert lease.fence == holder.fence + 1
    assert len(trips) == 2  # the release, and the waiter's one retry


def test_timeout_without_polling(leases: Leases, monkeypatch: pytest.MonkeyPatch) -> None:
    leases.acquire("t", ttl=5.0)
    trips = RoundTrips(leases, monkeypatch)
    waits: list[float] = []
    real_wait = leases._do_wait

    def counted_wait(name: str, seconds: float) -> None:
        waits.append(seconds)
        real_wait(name, seconds)

    monkeypatch.setattr(leases, "_do_wait", counted_wait)
    start = time.monotonic()
    with pytest.raises(NotAcquired):
        leases.acquire("t", ttl=5.0, blocking=True, timeout=0.5)
    assert 0.5 <= time.monotonic() - start < 0.9
    # One attempt, one BLPOP for the rest of the timeout (what the first attempt's round trip
    # left of it: more than a few ms on a busy machine), one last attempt at the deadline.
    assert len(trips) == 2 and len(waits) == 1 and 0.3 < waits[0] <= 0.5


def test_waiter_takes_over_when_the_holder_dies(
    leases: Leases, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No release ever comes: the BLPOP is bounded by the holder's remaining TTL."""
    holder = leases.acquire("dead", ttl=0.4, renew=False)
    trips = RoundTrips(leases, monkeypatch)
    start = time.monotonic()
    lease = leases.acquire("dead", ttl=5.0, blocking=True, timeout=3.0)
    assert 0.3 < time.monotonic() - start < 0.8
    assert lease.fence == holder.fence + 1
    assert len(trips) <= 3


def test_timeout_zero_tries_once(leases: Leases, monkeypatch: pytest.MonkeyPatch) -> None:
    leases.acquire("z", ttl=5.0)
    trips = RoundTrips(leases, monkeypatch)
    start = time.monotonic()
    with pytest.raises(NotAcquired):
        leases.acquire("z", ttl=5.0, blocking=True, timeout=0)
    assert time.monotonic() - start < 0.3 and len(trips) == 1


def test_free_lease_is_taken_without_waiting(leases: Leases) -> None:
    start = time.monotonic()
    leases.acquire("free", ttl=5.0, blocking=True)
    assert time.monotonic() - start < 0.3


def test_waits_are_capped_by_the_socket_timeout(
    redis_url: str, make_leases: Callable[..., Leases]
) -> None:
    """A BLPOP longer than the client's socket timeout would fail: it is cut into pieces."""
    client = redis.Redis.from_url(redis_url, socket_timeout=0.4)
    leases = make_leases(client)
    leases.acquire("cap", ttl=5.0)
    start = time.monotonic()
    with pytest.raises(NotAcquired):
        leases.acquire("cap", ttl=5.0, blocking=True, timeout=1.0)
    assert 1.0 <= time.monotonic() - start < 1.5
    client.close()
