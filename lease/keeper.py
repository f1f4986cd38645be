"""The per-process renewer: one Keeper renews every lease it tracks, in one round trip per tick.
It owns the renewal state of each (a `lease.state.LeaseState`): a Lease only reads it."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from lease.renewal import renewer_for
from lease.scripts import LeaseScripts
from lease.state import RENEW_FRACTION, RIPE_FRACTION, LeaseState
from lease.stats import LeaseStats, Stats

__all__ = ["RETRY_DELAY", "Keeper"]

log = logging.getLogger("lease")

# After a Redis error, the renewer tries again this many seconds later (until safe-until).
RETRY_DELAY = 0.05


# One lease in a renewal round trip: (its state, the TTL asked of Redis in seconds, its
# heartbeat count when the round trip started). A plain tuple: a tick builds a thousand.
_Renewal = tuple[LeaseState, float, int]

# Every live Keeper, so a forked child can reset them all (see _reset_keepers_in_child).
_KEEPERS: weakref.WeakSet[Keeper] = weakref.WeakSet()


class Keeper:
    """Renews the leases of one process, and tells their holders when one is lost.

    One Keeper serves every lease acquired through its `Leases` (normally one per process).
    It runs two daemon threads, started lazily with the first lease:

    - the *renewer* does the I/O: each tick is ONE ``renew_many`` script call (one per slot,
      pipelined, on a Redis Cluster: lease/renewal.py) covering every tracked lease that is
      due (a third of its TTL since its last renewal; leases a sixth of the way along ride
      along), whose holder called ``heartbeat()`` since that renewal, and that is within its
      ``max_lifetime``. It sleeps until the next lease is due, or until a heartbeat arrives
      for a lease that was due without one; it idles with no leases.
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
        self, client: Any, clock: Callable[[], float] = time.monotonic, threads: bool = True
    ) -> None:
        self.client = client
        self.clock = clock
        self.threads = threads
        self._scripts = LeaseScripts(client)
        self._renew_many = renewer_for(client)  # one call, or one per cluster slot
        self._reset()
        _KEEPERS.add(self)

    def _reset(self) -> None:
        """Create all mutable state: at construction, and again in a forked child, where the
        parent's threads do not exist and its locks may be held forever."""
        self._lock = threading.Lock()
        self._held: dict[LeaseState, None] = {}  # insertion-ordered set
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

    def held(self) -> list[Any]:
        """The Leases this keeper tracks (held, not released, not lost), oldest first."""
        with self._lock:
            return [state.holder for state in self._held]

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

    def track(self, state: LeaseState, holder: Any) -> None:
        """Start watching (and, if ``state.renews``, renewing) a freshly acquired lease, held
        by `holder` (handed to its on-lost callbacks), and count it as acquired."""
        state.holder = holder
        due = state.renewed_at + state.ttl * RENEW_FRACTION
        with self._lock:
            self._held[state] = None
            self.counters.incr_locked("acquired")
            wake_renewer = state.renews and due < self._renew_next
            wake_watchdog = state.safe_until < self._watch_next
            if wake_renewer:
                self._renew_next = due
            if wake_watchdog:
                self._watch_next = state.safe_until
            if self.threads and not self._workers:
                self._start_locked()
        if wake_renewer:
            self._renew_wake.set()
        if wake_watchdog:
            self._watch_wake.set()

    def heartbeat(self, state: LeaseState) -> None:
        """Count one unit of progress (no I/O, no lock); wake the renewer if it was waiting
        for this heartbeat to renew the lease (see LeaseState.due_at for the race)."""
        state.beats += 1
        if state.awaiting_beat:
            state.awaiting_beat = False
            self._renew_wake.set()

    def lost_event(self, state: LeaseState) -> threading.Event:
        """The Event set once the lease is lost (created on first use, already set if lost)."""
        with self._lock:
            if state.lost_event is None:
                state.lost_event = threading.Event()
                if state.lost_reason is not None:
                    state.lost_event.set()
            return state.lost_event

    def on_lost(self, state: LeaseState, callback: Callable[[Any], object]) -> None:
        """Call ``callback(holder)`` when the lease is lost, or at once if it already is."""
        with self._lock:
            if state.lost_reason is None:
                if state.callbacks is None:
                    state.callbacks = []
                state.callbacks.append(callback)
                return
        state.run_callback(callback)

    def begin_release(self, state: LeaseState) -> bool:
        """Mark the lease released and stop renewing and watching it, in one critical section;
        False (and nothing changed) if it already was released."""
        with self._lock:
            if state.released:
                return False
            state.released = True
            self._held.pop(state, None)
            return True

    def lose(self, state: LeaseState, reason: str) -> None:
        """Mark the lease lost (if it is not already) and tell its holder."""
        with self._lock:
            lost = [state] if self._lose(state, reason) else []
        self._announce(lost)

    def confirm(
        self, state: LeaseState, ttl: float, beats: int, start: float, renewed: bool
    ) -> None:
        """Apply the answer of a direct ``Lease.renew()`` round trip that started at `start`."""
        end = self.clock()
        lost: list[LeaseState] = []
        with self._lock:
            left = state.safe_until - end
            if renewed and left > 0 and state in self._held:  # the usual answer: _settle's
                state.confirm(start, ttl, beats)
                self.counters.renewal_locked(end - start, 1, 0, left)
                return
            margin = self._settle((state, ttl, beats), renewed, start, end, lost)
            ok = margin is not None
            self.counters.renewal_locked(end - start, int(ok), int(not ok), margin)
        if lost:
            self._announce(lost)

    # -- renewal round ----------------------------------------------------------------------

    def _plan(self, now: float) -> list[_Renewal]:
        """The leases to renew in this round (lock held)."""
        batch = []
        for state in self._held:
            if (
                state.renews
                and (not state.progress or state.beats != state.beats_seen)
                and now - state.renewed_at >= state.ttl * RIPE_FRACTION
            ):
                ttl = state.renewal_ttl(now)
                if ttl is not None:
                    batch.append((state, ttl, state.beats))
        return batch

    def _do_renew_many(self, batch: list[_Renewal]) -> set[int]:
        """One round trip (per cluster node) renewing `batch`; the positions Redis refused."""
        keys, tokens = [s.key for s, _, _ in batch], [s.token for s, _, _ in batch]
        ttls = [str(max(1, round(ttl * 1000))) for _, ttl, _ in batch]  # ms(), inlined
        return self._renew_many(self._scripts, keys, tokens, ttls)

    def _apply(self, batch: list[_Renewal], refused: set[int], start: float) -> int:
        """Record Redis's answers for a tick's round trip that started at `start`."""
        end = self.clock()
        lost: list[LeaseState] = []
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
        self, item: _Renewal, ok: bool, start: float, end: float, lost: list[LeaseState]
    ) -> float | None:
        """Apply Redis's answer `ok` for one lease (lock held). Return the margin it had left
        before its safe-until if the renewal counts; else append it to `lost` if it was still
        held, and return None."""
        state, ttl, beats = item
        if state not in self._held:  # released or lost while the round trip ran
            return None
        margin = state.safe_until - end
        if ok and margin > 0:
            state.confirm(start, ttl, beats)
            return margin
        if not ok:
            reason = "renewal refused: the token no longer matches"
        else:
            # Redis extended it, but the holder may already have seen check() fail: lost is
            # final, so do not resurrect it.
            reason = "safe-until passed before the renewal was confirmed"
        if self._lose(state, reason):
            lost.append(state)
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

    def _expire(self, now: float) -> list[LeaseState]:
        """Mark lost every lease whose safe-until has passed (lock held); return them."""
        return [
            state
            for state in list(self._held)
            if now >= state.safe_until
            and self._lose(state, "safe-until passed without a confirmed renewal")
        ]

    def _lose(self, state: LeaseState, reason: str) -> bool:
        """Make the lease lost (lock held); False if it already was."""
        if state.lost_reason is not None:
            return False
        state.lost_reason = reason
        self._held.pop(state, None)
        return True

    def _announce(self, lost: list[LeaseState]) -> None:
        """Tell the holders of newly lost leases: set the Event, run the callbacks."""
        for state in lost:
            self.counters.lost(state.lost_reason or "unknown")
            state.announce_lost()

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
        for state in self._held:
            due = state.due_at(now)
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
                next_at = min((state.safe_until for state in self._held), default=math.inf)
                self._watch_next = next_at
            self._announce(lost)
            self._watch_wake.wait(None if next_at == math.inf else max(0.0, next_at - now))
            self._watch_wake.clear()


def _reset_keepers_in_child() -> None:
    for keeper in list(_KEEPERS):
        keeper._reset()


os.register_at_fork(after_in_child=_reset_keepers_in_child)
