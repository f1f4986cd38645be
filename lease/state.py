"""The renewal state of one held lease, and the rules on it: until when it is safe, when it is
due, what TTL to ask for, how a confirmed renewal moves it, how its holder hears of its loss.

A `LeaseState` is the one record the Keeper and a Lease share. The Keeper owns it: only the
Keeper writes it after construction (under its lock, except the lock-free heartbeat count)
and calls its methods; the Lease only reads it. It knows nothing of the Lease that holds it
beyond the opaque `holder`, handed to on-lost callbacks and returned by ``Keeper.held()``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "FIXED_MARGIN", "MIN_SAFE", "RENEW_FRACTION", "RIPE_FRACTION", "LeaseState", "safe_deadline",
]

log = logging.getLogger("lease")

# A lease is due for renewal a third of its TTL after its last confirmed renewal, which leaves
# two more chances before its safe-until.
RENEW_FRACTION = 1 / 3
# A tick also renews every lease at least this far along, so leases acquired at different
# moments fall into the same round trip instead of each waking the renewer.
RIPE_FRACTION = 1 / 6

# Subtracted from every safe-until on top of the drift fraction, for what does not scale with
# the TTL: the TTL rounded to whole milliseconds, Redis's millisecond expiry resolution, and
# the delay between a watchdog's deadline and its thread actually running.
FIXED_MARGIN = 0.005  # seconds
# A renewal that would leave less safe time than this (after its margin) is not made: near the
# end of its max lifetime, a lease lapses instead.
MIN_SAFE = 0.001  # seconds


def safe_deadline(start: float, ttl: float, drift: float) -> float:
    """The local deadline until which a lease set with `ttl` at `start` is surely still ours.

    `start` is the local clock when the acquire/renew round trip *started*: Redis set the TTL
    later than that, so its expiry is no earlier than start + ttl (on Redis's clock). The drift
    margin (a fraction of the TTL plus FIXED_MARGIN) covers the two clocks running at
    slightly different rates.
    """
    return start + ttl - (ttl * drift + FIXED_MARGIN)


class LeaseState:
    """What the Keeper needs to renew, watch and report one lease.

    Built from the acquire's answer: `key` (bytes: a tick packs a thousand of them), `token`,
    `fence`, the lease `ttl` and the `first_ttl` the acquire asked for, `started` (the local
    clock when the acquire round trip started), `max_lifetime`, `renews` (the keeper renews it
    while it shows progress), `progress` (False: renewed without heartbeats, so the lease lives
    exactly as long as its process and its keeper do) and the clock `drift` of its Leases.
    """

    __slots__ = (
        "acquired_at", "awaiting_beat", "beats", "beats_seen", "callbacks", "drift", "fence",
        "holder", "key", "lost_event", "lost_reason", "max_lifetime", "name", "progress",
        "released", "renewed_at", "renews", "safe_until", "token", "ttl",
    )

    def __init__(
        self,
        name: str,
        key: bytes,
        token: str,
        fence: int,
        ttl: float,
        first_ttl: float,
        started: float,
        max_lifetime: float | None,
        renews: bool,
        progress: bool,
        drift: float,
    ) -> None:
        self.name = name
        self.key = key
        self.token = token
        self.fence = fence
        self.ttl = ttl
        self.max_lifetime = max_lifetime
        self.renews = renews
        self.progress = progress
        self.drift = drift
        self.holder: Any = None  # the Lease, set by Keeper.track; never looked into
        self.acquired_at = started
        self.renewed_at = started  # start of the last confirmed round trip
        self.safe_until = safe_deadline(started, first_ttl, drift)
        self.beats = 0  # heartbeat count
        self.beats_seen = 0  # heartbeat count when the last confirmed renewal started
        self.awaiting_beat = False  # the renewer waits for a heartbeat to renew this
        self.released = False
        self.lost_reason: str | None = None
        self.lost_event: threading.Event | None = None  # created on first use: acquire is hot
        self.callbacks: list[Callable[[Any], object]] | None = None  # on first on_lost

    def renewal_ttl(self, now: float) -> float | None:
        """The TTL to ask for at `now`: the lease TTL, capped so the lease ends by its max
        lifetime; None once that leaves nothing worth renewing."""
        if self.max_lifetime is None:
            return self.ttl
        ttl = min(self.ttl, self.acquired_at + self.max_lifetime - now)
        return ttl if ttl > ttl * self.drift + FIXED_MARGIN + MIN_SAFE else None

    def confirm(self, start: float, ttl: float, beats: int) -> None:
        """Redis confirmed a renewal to `ttl` whose round trip started at `start`, when the
        heartbeat count was `beats` (Keeper only, under its lock). Rounds may be answered out
        of order: keep the latest of each."""
        if start > self.renewed_at:
            self.renewed_at = start
        safe_until = safe_deadline(start, ttl, self.drift)
        if safe_until > self.safe_until:
            self.safe_until = safe_until
        if beats > self.beats_seen:
            self.beats_seen = beats
        self.awaiting_beat = False

    def due_at(self, now: float) -> float | None:
        """When the renewer should next look at the lease (Keeper only, under its lock); None
        when only a heartbeat can help."""
        if not self.renews or self.renewal_ttl(now) is None:
            return None  # not ours to renew, or past its max lifetime: it will lapse
        due = self.renewed_at + self.ttl * RENEW_FRACTION
        if due > now or not self.progress or self.beats != self.beats_seen:
            return due  # (a lease acquired with progress=False needs no heartbeat)
        # Due, but no progress yet. Set the flag before re-reading the count, so that a
        # heartbeat racing with us either is seen here or sees the flag and wakes the renewer.
        self.awaiting_beat = True
        return due if self.beats != self.beats_seen else None

    def announce_lost(self) -> None:
        """Tell the holder the lease is lost (Keeper only, once, after marking it lost): set
        the Event, log, run the callbacks."""
        if self.lost_event is not None:  # else Keeper.lost_event creates it already set
            self.lost_event.set()
        log.warning("lease %r (fence %d) lost: %s", self.name, self.fence, self.lost_reason)
        for callback in self.callbacks or ():
            self.run_callback(callback)

    def run_callback(self, callback: Callable[[Any], object]) -> None:
        """Run one on-lost callback with the holder; log, never raise, what it raises."""
        try:
            callback(self.holder)
        except Exception:
            log.exception("on_lost callback %r of lease %r raised", callback, self.name)
