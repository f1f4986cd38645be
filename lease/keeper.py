"""The per-process renewer: one Keeper renews every lease it tracks, in one round trip per tick."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from lease.scripts import TOKEN_CHARS, LeaseScripts
from lease.stats import LeaseStats, Stats

if TYPE_CHECKING:
    from lease.lease import Lease

__all__ = ["RENEW_FRACTION", "RETRY_DELAY", "RIPE_FRACTION", "Keeper"]

log = logging.getLogger("lease")

# A lease is due for renewal a third of its TTL after its last confirmed renewal, which leaves
# two more chances before its safe-until.
RENEW_FRACTION = 1 / 3
# A tick also renews every lease at least this far along, so leases acquired at different
# moments fall into the same round trip instead of each waking the renewer.
RIPE_FRACTION = 1 / 6
# After a Redis error, the renewer tries again this many seconds later (until safe-until).
RETRY_DELAY = 0.05


# One lease in a renewal round trip: (lease, the TTL asked of Redis in seconds, the lease's
# heartbeat count when the round trip started). A plain tuple: a tick builds a thousand.
_Renewal = tuple["Lease", float, int]


# Every live Keeper, so a forked child can reset them all (see _reset_keepers_in_child).
_KEEPERS: weakref.WeakSet[Keeper] = weakref.WeakSet()


class Keeper:
    """Renews the leases of one process, and tells their holders when one is lost.

    One Keeper serves every lease acquired through its `Leases` (normally one per process).
    It runs two daemon threads, started lazily with the first lease:

    - the *renewer* does the I/O: each tick is ONE ``renew_many`` script call covering every
      tracked lease that is due (a third of its TTL since its last renewal; leases a sixth of
      the way along ride along), whose holder called ``heartbeat()`` since that renewal, and
      that is within its ``max_lifetime``. It sleeps until the next lease is due, or until a
      heartbeat arrives for a lease that was due without one; it idles with no leases.
    - the *watchdog* does no I/O: it wakes at the earliest safe-until and marks overdue leases
      lost. It exists so a renewal stuck in a slow or retrying Redis call cannot delay the
      loss notice past safe-until.

    A lease is lost when Redis refuses its renewal (the token no longer matches) or when its
    safe-until passes without a confirmed renewal. Then its ``lost_event`` is set and its
    ``on_lost`` callbacks run in the keeper's thread (exceptions are logged). A Redis error
    never kills the renewer: it retries every RETRY_DELAY seconds until safe-until.

    Timeline (TTL 3 s, drift 0.01, so safe-until is 3 s - 35 ms after each round trip *starts*)::

        t=0.000  acquire round trip starts        safe_until = 2.965; Redis expiry >= 3.000
        t=0.400  holder: heartbeat()
        t=1.000  tick: due + heartbeat -> renew   safe_until = 3.965
        t=1.200  holder hangs; no more heartbeats
        t=2.000  tick: due, no heartbeat -> skip  (a heartbeat now would wake the renewer)
        t=3.965  watchdog: lost_event set, callbacks run; check() raises LeaseLost
        t=4.000  Redis expires the key; another worker acquires with a higher fence

    ``tick()`` is one renewal round, callable directly (with ``threads=False`` and a fake
    ``clock``) to test the expiry logic without sleeping. After ``os.fork()`` the child's
    keepers start empty: a child never renews its parent's leases.
    """

    def __init__(
        self,
        client: Any,
        clock: Callable[[], float] = time.monotonic,
        threads: bool = True,
    ) -> None:
        self.client = client
        self.clock = clock
        self.threads = threads
        self._scripts = LeaseScripts(client)
        self._reset()
        _KEEPERS.add(self)

    def _reset(self) -> None:
        """Create all mutable state: at construction, and again in a forked child."""
        self._lock = threading.Lock()
        self._held: dict[Lease, None] = {}  # insertion-ordered set
        self._renew_wake = threading.Event()
        self._watch_wake = threading.Event()
        self._renew_next = math.inf  # when the renewer plans to wake
        self._watch_next = math.inf  # when the watchdog plans to wake
        self._retry_at: float | None = None  # set after a Redis error
        self._failing = False
        self._workers: list[threading.Thread] = []
        self._generation = 0  # threads of an older generation exit
        self.counters = Stats(self._lock)  # shares the lock: see Stats

    # -- public -------------------------------------------------------------------------------

    def held(self) -> list[Lease]:
        """The leases this keeper tracks (held, not released, not lost), oldest first."""
        with self._lock:
            return list(self._held)

    def stats(self) -> LeaseStats:
        """Counters, renewal round-trip times and margin (see lease.stats.LeaseStats)."""
        with self._lock:
            held = len(self._held)
        return self.counters.snapshot(held)

    def tick(self) -> int:
        """Run one renewal round now; return how many leases Redis confirmed.

        Marks overdue leases lost, renews every due lease with progress in ONE round trip, and
        applies the answers. A Redis error is logged and swallowed (the next round retries).
        """
        with self._lock:
            now = self.clock()
            lost = self._expire(now)
            batch = self._plan(now)
        self._announce(lost)
        if not batch:
            return 0
        self.counters.incr("ticks")
        start = self.clock()
        try:
            results = self._do_renew_many(batch)
        except (RedisError, OSError) as exc:
            self._round_failed(batch, exc)
            return 0
        return self._apply(batch, results, start)

    def start(self) -> None:
        """Start the renewer and watchdog threads (normally started by the first lease)."""
        with self._lock:
            self._start_locked()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the threads; tracked leases are no longer renewed. A later lease restarts them."""
        with self._lock:
            self._generation += 1
            workers, self._workers = self._workers, []
        self._renew_wake.set()
        self._watch_wake.set()
        for worker in workers:
            if worker is not threading.current_thread():
                worker.join(timeout)

    # -- called by Leases and Lease -------------------------------------------------------

    def track(self, lease: Lease) -> None:
        """Start watching (and, if ``lease.renews``, renewing) a freshly acquired lease, and
        count it as acquired."""
        due = lease._renewed_at + lease.ttl * RENEW_FRACTION
        with self._lock:
            self._held[lease] = None
            self.counters.incr_locked("acquired")
            wake_renewer = lease.renews and due < self._renew_next
            wake_watchdog = lease._safe_until < self._watch_next
            if wake_renewer:
                self._renew_next = due
            if wake_watchdog:
                self._watch_next = lease._safe_until
            if self.threads and not self._workers:
                self._start_locked()
        if wake_renewer:
            self._renew_wake.set()
        if wake_watchdog:
            self._watch_wake.set()

    def forget(self, lease: Lease) -> None:
        """Stop renewing and watching `lease` at once (it is being released)."""
        with self._lock:
            self._held.pop(lease, None)

    def begin_release(self, lease: Lease) -> bool:
        """Mark `lease` released and forget it, in one critical section; False (and nothing
        changed) if it already was released."""
        with self._lock:
            if lease._released:
                return False
            lease._released = True
            self._held.pop(lease, None)
            return True

    def poke(self) -> None:
        """Wake the renewer: a lease that was due without progress just heartbeat."""
        self._renew_wake.set()

    def lose(self, lease: Lease, reason: str) -> None:
        """Mark `lease` lost (if it is not already) and tell its holder."""
        with self._lock:
            lost = [lease] if self._lose(lease, reason) else []
        self._announce(lost)

    def confirm(self, lease: Lease, ttl: float, beats: int, start: float, renewed: bool) -> None:
        """Apply the answer of a direct ``Lease.renew()`` round trip that started at `start`."""
        end = self.clock()
        lost: list[Lease] = []
        with self._lock:
            left = lease._safe_until - end
            if renewed and left > 0 and lease in self._held:  # the usual answer: _settle's
                lease._confirm(start, ttl, beats)
                self.counters.renewal_locked(end - start, 1, 0, left)
                return
            margin = self._settle((lease, ttl, beats), renewed, start, end, lost)
            ok = margin is not None
            self.counters.renewal_locked(end - start, int(ok), int(not ok), margin)
        if lost:
            self._announce(lost)

    # -- renewal round ----------------------------------------------------------------------

    def _plan(self, now: float) -> list[_Renewal]:
        """The leases to renew in this round (lock held)."""
        batch = []
        for lease in self._held:
            if (
                lease.renews
                and (not lease.progress or lease._beats != lease._beats_seen)
                and now - lease._renewed_at >= lease.ttl * RIPE_FRACTION
            ):
                ttl = lease._renewal_ttl(now)
                if ttl is not None:
                    batch.append((lease, ttl, lease._beats))
        return batch

    def _do_renew_many(self, batch: list[_Renewal]) -> set[int]:
        """One round trip renewing `batch`; returns the positions Redis refused."""
        keys = [lease._key for lease, _, _ in batch]
        tokens = "".join([lease.token for lease, _, _ in batch])
        ttls = ",".join([str(max(1, round(ttl * 1000))) for _, ttl, _ in batch])
        refused = self._scripts.run(self._scripts.renew_many, keys, [TOKEN_CHARS, tokens, ttls])
        return {int(i) - 1 for i in refused}

    def _apply(self, batch: list[_Renewal], refused: set[int], start: float) -> int:
        """Record Redis's answers for a tick's round trip that started at `start`."""
        end = self.clock()
        lost: list[Lease] = []
        renewed = 0
        least = math.inf
        with self._lock:
            for i, item in enumerate(batch):
                margin = self._settle(item, i not in refused, start, end, lost)
                if margin is not None:
                    renewed += 1
                    if margin < least:
                        least = margin
            self._retry_at = None
            self.counters.renewal_locked(end - start, renewed, len(batch) - renewed,
                                         None if least == math.inf else least)
        self._failing = False
        self._announce(lost)
        return renewed

    def _settle(
        self, item: _Renewal, ok: bool, start: float, end: float, lost: list[Lease]
    ) -> float | None:
        """Apply Redis's answer `ok` for one lease (lock held). Return the margin it had left
        before its safe-until if the renewal counts; else append it to `lost` if it was still
        held, and return None."""
        lease, ttl, beats = item
        if lease not in self._held:  # released or lost while the round trip ran
            return None
        margin = lease._safe_until - end
        if ok and margin > 0:
            lease._confirm(start, ttl, beats)
            return margin
        if not ok:
            reason = "renewal refused: the token no longer matches"
        else:
            # Redis extended it, but the holder may already have seen check() fail: lost is
            # final, so do not resurrect it.
            reason = "safe-until passed before the renewal was confirmed"
        if self._lose(lease, reason):
            lost.append(lease)
        return None

    def _round_failed(self, batch: list[_Renewal], exc: BaseException) -> None:
        self.counters.incr("renewal_errors")
        self.counters.incr("renewal_failures", len(batch))
        # The exception text may name the server; log only its type.
        level = logging.DEBUG if self._failing else logging.WARNING
        log.log(level, "renewing %d lease(s) failed: %s; retrying until their safe-until",
                len(batch), type(exc).__name__)
        self._failing = True
        with self._lock:
            now = self.clock()
            self._retry_at = now + RETRY_DELAY
            lost = self._expire(now)
        self._announce(lost)

    # -- loss -------------------------------------------------------------------------------

    def _expire(self, now: float) -> list[Lease]:
        """Mark lost every lease whose safe-until has passed (lock held); return them."""
        return [
            lease
            for lease in list(self._held)
            if now >= lease._safe_until
            and self._lose(lease, "safe-until passed without a confirmed renewal")
        ]

    def _lose(self, lease: Lease, reason: str) -> bool:
        """Make `lease` lost (lock held); False if it already was."""
        if lease._lost_reason is not None:
            return False
        lease._lost_reason = reason
        self._held.pop(lease, None)
        return True

    def _announce(self, lost: list[Lease]) -> None:
        """Tell the holders of newly lost leases: set the Event, run the callbacks."""
        for lease in lost:
            if lease._lost_event is not None:  # else lost_event creates it already set
                lease._lost_event.set()
            self.counters.incr("lost")
            log.warning("lease %r (fence %d) lost: %s", lease.name, lease.fence, lease._lost_reason)
            for callback in lease._callbacks or ():
                run_callback(callback, lease)

    # -- threads ----------------------------------------------------------------------------

    def _start_locked(self) -> None:
        if self._workers:
            return
        self._generation += 1
        self._workers = [
            threading.Thread(
                target=loop, args=(self._generation,), name=f"lease-{role}", daemon=True
            )
            for role, loop in (("renewer", self._renewer_loop), ("watchdog", self._watchdog_loop))
        ]
        for worker in self._workers:
            worker.start()

    def _renewer_loop(self, generation: int) -> None:
        while True:
            with self._lock:
                if self._generation != generation:
                    return
                delay = self._renew_delay(self.clock())
            self._renew_wake.wait(delay)
            self._renew_wake.clear()
            if self._generation != generation:
                return
            try:
                self.tick()
            except Exception:  # the renewer must outlive any bug in one round
                log.exception("lease renewal round failed")

    def _renew_delay(self, now: float) -> float | None:
        """Seconds until the next renewal is due, None if nothing is (lock held)."""
        next_at = math.inf
        for lease in self._held:
            due = _due_at(lease, now)
            if due is not None and due < next_at:
                next_at = due
        if self._retry_at is not None and next_at < self._retry_at:
            next_at = self._retry_at
        self._renew_next = next_at
        return None if next_at == math.inf else max(0.0, next_at - now)

    def _watchdog_loop(self, generation: int) -> None:
        while True:
            with self._lock:
                if self._generation != generation:
                    return
                now = self.clock()
                lost = self._expire(now)
                next_at = min((lease._safe_until for lease in self._held), default=math.inf)
                self._watch_next = next_at
            self._announce(lost)
            self._watch_wake.wait(None if next_at == math.inf else max(0.0, next_at - now))
            self._watch_wake.clear()

    def _reset_after_fork(self) -> None:
        # The parent's threads do not exist here and its locks may be held forever; the
        # parent's leases stay the parent's (Lease methods refuse them in the child).
        self._reset()


def _due_at(lease: Lease, now: float) -> float | None:
    """When the renewer should next look at `lease`; None when only a heartbeat can help."""
    if not lease.renews or lease._renewal_ttl(now) is None:
        return None  # not ours to renew, or past its max lifetime: it will lapse
    due = lease._renewed_at + lease.ttl * RENEW_FRACTION
    if due > now or not lease.progress or lease._beats != lease._beats_seen:
        return due  # (a lease acquired with progress=False needs no heartbeat)
    # Due, but no progress yet. Set the flag before re-reading the count, so that a heartbeat
    # racing with us either is seen here or sees the flag and pokes the renewer.
    lease._awaiting_beat = True
    return due if lease._beats != lease._beats_seen else None


def run_callback(callback: Callable[[Lease], object], lease: Lease) -> None:
    """Run one on-lost callback; log, never raise, what it raises."""
    try:
        callback(lease)
    except Exception:
        log.exception("on_lost callback %r of lease %r raised", callback, lease.name)


def _reset_keepers_in_child() -> None:
    for keeper in list(_KEEPERS):
        keeper._reset_after_fork()


os.register_at_fork(after_in_child=_reset_keepers_in_child)
