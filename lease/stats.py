"""Thread-safe counters and timings of one Keeper, returned by ``stats()`` as a LeaseStats."""

from __future__ import annotations

import threading
from typing import Protocol, TypedDict

__all__ = ["COUNTERS", "LeaseStats", "Observer", "Stats", "set_observer"]


class LeaseStats(TypedDict):
    """What ``Leases.stats()`` and ``Keeper.stats()`` return (a plain dict at runtime)."""

    acquired: int  # successful acquires
    contended: int  # acquire attempts refused because someone else held the lease
    renewed: int  # renewals confirmed by Redis (keeper ticks and direct renew())
    renewal_failures: int  # renewals refused, or lost to a Redis error
    renewal_errors: int  # keeper round trips that raised a Redis error
    lost: int  # leases marked lost
    released: int  # successful releases
    ticks: int  # keeper renewal round trips
    held: int  # leases the keeper tracks now
    renew_rtt_last_ms: float  # the last renewal round trip
    renew_rtt_max_ms: float  # the slowest renewal round trip
    # The least time a lease had left before its safe-until when a renewal was confirmed:
    # near 0 means leases almost lapsed (raise the TTL); None before the first renewal.
    renew_margin_min_ms: float | None


COUNTERS = (
    "acquired", "contended", "renewed", "renewal_failures", "renewal_errors", "lost",
    "released", "ticks",
)


class Observer(Protocol):
    """Told of every count as it happens (e.g. to export metrics); must not block."""

    def counted(self, counter: str, n: int) -> None: ...

    def renewal(self, rtt: float, margin: float | None) -> None: ...

    def lost(self, reason: str) -> None: ...


_observer: Observer | None = None


def set_observer(observer: Observer | None) -> None:
    """Tell `observer` of every count of every Keeper in this process (None: nobody)."""
    global _observer
    _observer = observer


class Stats:
    """The counters, round-trip times and margin behind LeaseStats, safe to update from any
    thread.

    `lock` guards them (a new lock if None). A Keeper passes its own lock, so that the hot
    paths (acquire, renew, release) update their counter inside the critical section they
    enter anyway, with the ``*_locked`` methods, instead of taking a second lock.
    """

    def __init__(self, lock: threading.Lock | None = None) -> None:
        self._lock = threading.Lock() if lock is None else lock
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._rtt_last = 0.0
        self._rtt_max = 0.0
        self._margin_min: float | None = None

    def incr(self, counter: str, n: int = 1) -> None:
        """Add `n` to `counter` (one of COUNTERS)."""
        with self._lock:
            self._counts[counter] += n
        if _observer is not None:
            _observer.counted(counter, n)

    def incr_locked(self, counter: str, n: int = 1) -> None:
        """``incr``, for a caller that holds the lock."""
        self._counts[counter] += n
        if _observer is not None:
            _observer.counted(counter, n)

    def lost(self, reason: str) -> None:
        """Count one lease lost for `reason`."""
        self.incr("lost")
        if _observer is not None:
            _observer.lost(reason)

    def renewal_locked(
        self, rtt: float, renewed: int, failed: int, margin: float | None
    ) -> None:
        """Record one renewal round trip (`rtt` and `margin` in seconds); the caller holds the
        lock."""
        counts = self._counts
        counts["renewed"] += renewed
        counts["renewal_failures"] += failed
        self._rtt_last = rtt
        if rtt > self._rtt_max:
            self._rtt_max = rtt
        if margin is not None and (self._margin_min is None or margin < self._margin_min):
            self._margin_min = margin
        if _observer is not None:
            _observer.counted("renewed", renewed)
            _observer.counted("renewal_failures", failed)
            _observer.renewal(rtt, margin)

    def snapshot(self, held: int) -> LeaseStats:
        """The current values, with `held` leases tracked."""
        with self._lock:
            c = dict(self._counts)
            rtt_last, rtt_max, margin = self._rtt_last, self._rtt_max, self._margin_min
        return LeaseStats(
            acquired=c["acquired"],
            contended=c["contended"],
            renewed=c["renewed"],
            renewal_failures=c["renewal_failures"],
            renewal_errors=c["renewal_errors"],
            lost=c["lost"],
            released=c["released"],
            ticks=c["ticks"],
            held=held,
            renew_rtt_last_ms=round(rtt_last * 1000.0, 3),
            renew_rtt_max_ms=round(rtt_max * 1000.0, 3),
            renew_margin_min_ms=None if margin is None else round(margin * 1000.0, 3),
        )
