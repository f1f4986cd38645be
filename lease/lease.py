"""Token-checked, fenced Redis leases: `Leases` hands them out, a `Lease` is one held lease."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from lease.errors import LeaseLost, NotHeld, raise_refused
from lease.keeper import Keeper, run_callback
from lease.keys import (
    FENCE_PREFIX,
    LEASE_PREFIX,
    WAITING_PREFIX,
    WAKE_PREFIX,
    WAKE_TTL_MS,
    fence_key,
    lease_key,
    validate_name,
    waiting_key,
    wake_key,
)
from lease.scripts import TOKEN_CHARS, LeaseScripts
from lease.stats import LeaseStats

__all__ = ["DEFAULT_TTL", "FIXED_MARGIN", "MIN_TTL", "Lease", "Leases", "safe_deadline"]

log = logging.getLogger("lease")

DEFAULT_TTL = 10.0  # seconds
MIN_TTL = 0.01  # seconds; below this the drift margin eats the lease
# Subtracted from every safe-until on top of the drift fraction, for what does not scale with
# the TTL: the TTL rounded to whole milliseconds, Redis's millisecond expiry resolution, and
# the delay between a watchdog's deadline and its thread actually running.
FIXED_MARGIN = 0.005  # seconds
# A BLPOP timeout of 0 blocks forever: never ask for less than this.
MIN_WAIT = 0.001  # seconds
# Longest single BLPOP when neither the holder's TTL nor the caller's timeout bounds it.
MAX_WAIT = 10.0  # seconds
_INF = math.inf

# -- hot-path helpers ------------------------------------------------------------------------
# An acquire, renew or release is one round trip; what Python does around it is overhead on
# every call, so these avoid a syscall or an encoding per call where they can.

# This process's id, refreshed in a forked child: os.getpid() is a syscall, and every Lease
# method checks it (a Lease belongs to the process that acquired it).
_pid = os.getpid()

# Lease tokens, drawn from os.urandom in batches (one getrandom syscall per _TOKEN_BATCH
# tokens instead of one per acquire). deque.popleft is atomic, so threads need no lock; a
# forked child empties the pool, so it never hands out a token its parent also holds.
_TOKEN_BATCH = 64
_tokens: deque[str] = deque()

# Key parts as bytes, so a release builds its keys without encoding strings. Every key of a
# lease is its prefix + the same tagged name (see lease.keys).
_LEASE_PREFIX_LEN = len(LEASE_PREFIX.encode())
_WAITING_PREFIX = WAITING_PREFIX.encode()
_WAKE_PREFIX = WAKE_PREFIX.encode()
_WAKE_TTL = str(WAKE_TTL_MS).encode()


def _new_token() -> str:
    """A fresh random token of TOKEN_CHARS hex characters (as secrets.token_hex would make)."""
    try:
        return _tokens.popleft()
    except IndexError:
        raw = os.urandom(TOKEN_CHARS // 2 * _TOKEN_BATCH).hex()
        _tokens.extend([raw[i:i + TOKEN_CHARS] for i in range(TOKEN_CHARS, len(raw), TOKEN_CHARS)])
        return raw[:TOKEN_CHARS]


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()
    _tokens.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def safe_deadline(start: float, ttl: float, drift: float) -> float:
    """The local deadline until which a lease set with `ttl` at `start` is surely still ours.

    `start` is the local clock when the acquire/renew round trip *started*: Redis set the TTL
    later than that, so its expiry is no earlier than start + ttl (on Redis's clock). The drift
    margin (a fraction of the TTL plus FIXED_MARGIN) covers the two clocks running at
    slightly different rates.
    """
    return start + ttl - (ttl * drift + FIXED_MARGIN)


class Lease:
    """One held lease: its name, random token, fencing token, and local view of its validity.

    Obtain it from ``Leases.acquire``; use it as a context manager to release it on exit. The
    holder calls ``heartbeat()`` after each unit of progress (the keeper renews only leases that
    progressed) and ``check()`` before each unit (it raises LeaseLost once the lease is lost or
    past ``safe_until``). Every durable write made under the lease must carry ``fence`` and be
    refused by the store when a newer fence was seen: a holder paused past its TTL (GC, SIGSTOP,
    network) learns it lost the lease only when it wakes, possibly mid-write.

    A Lease belongs to the process that acquired it: in a forked child, its methods raise
    NotHeld and nothing renews it.
    """

    __slots__ = (
        "_acquired_at", "_awaiting_beat", "_beats", "_beats_seen", "_callbacks", "_keeper",
        "_key", "_lost_event", "_lost_reason", "_owner", "_pid", "_released", "_renewed_at",
        "_safe_until", "_ttl_ms", "fence", "max_lifetime", "name", "progress", "renews",
        "token", "ttl",
    )

    def __init__(
        self,
        owner: Leases,
        name: str,
        key: str,
        token: str,
        fence: int,
        ttl: float,
        started: float,
        first_ttl: float,
        max_lifetime: float | None,
        renews: bool,
        progress: bool = True,
    ) -> None:
        self.name = name
        self.token = token
        self.fence = fence
        self.ttl = ttl
        self.max_lifetime = max_lifetime
        self.renews = renews  # renewed by the keeper while it shows progress
        # False: renewed without heartbeats, so the lease lives exactly as long as its process
        # (and its keeper) does; a marker of liveness rather than of progress.
        self.progress = progress
        self._owner = owner
        self._keeper = owner.keeper
        self._key = key.encode()  # bytes: a tick packs a thousand of them
        self._pid = _pid
        # Renewal state, guarded by the keeper's lock.
        self._acquired_at = started
        self._renewed_at = started
        self._safe_until = safe_deadline(started, first_ttl, owner.drift)
        self._beats = 0  # heartbeat() count
        self._beats_seen = 0  # heartbeat count when the last confirmed renewal started
        self._awaiting_beat = False  # the renewer waits for a heartbeat to renew this
        self._released = False
        self._lost_reason: str | None = None
        self._lost_event: threading.Event | None = None  # created on first use: acquire is hot
        self._callbacks: list[Callable[[Lease], object]] | None = None  # on first on_lost
        self._ttl_ms: bytes | None = None  # the (fixed) `ttl` as renew's argument; lazy

    def __repr__(self) -> str:
        state = "lost" if self._lost_reason else "released" if self._released else "held"
        return f"<Lease {self.name!r} fence={self.fence} ttl={self.ttl} {state}>"

    @property
    def safe_until(self) -> float:
        """Local (injected clock) deadline until which the lease is surely still ours."""
        return self._safe_until

    @property
    def lost_event(self) -> threading.Event:
        """Set once the lease is lost (by the keeper, or a refused renew/release)."""
        with self._keeper._lock:
            if self._lost_event is None:
                self._lost_event = threading.Event()
                if self._lost_reason is not None:
                    self._lost_event.set()
            return self._lost_event

    @property
    def lost(self) -> bool:
        """True once the lease is marked lost, or is held and past its safe-until."""
        if self._lost_reason is not None:
            return True
        return not self._released and self._keeper.clock() >= self._safe_until

    def heartbeat(self) -> None:
        """Record progress (no I/O): the keeper renews the lease at its next due tick.

        Without a heartbeat since the last renewal the keeper lets the lease lapse, so a hung
        holder loses it within about one TTL.
        """
        if self._pid != _pid:
            self._own()
        self._beats += 1
        if self._awaiting_beat:
            self._awaiting_beat = False
            self._keeper.poke()

    def check(self) -> None:
        """Raise LeaseLost if the lease is lost or past safe-until, NotHeld if released (no I/O).

        Call it before each unit of work: it is the holder's last line of defence when the
        keeper could not warn it in time.
        """
        if self._pid != _pid:
            self._own()
        if self._lost_reason is not None:
            raise LeaseLost(self.name, self._lost_reason)
        if self._released:
            raise NotHeld(self.name, "already released")
        if self._keeper.clock() >= self._safe_until:
            raise LeaseLost(self.name, "safe-until passed without a confirmed renewal")

    def renew(self) -> None:
        """Extend the lease by its TTL now, in one round trip (the keeper normally does this).

        Raises LeaseLost if Redis refuses (the token no longer matches; the lease is then
        marked lost), if it was already lost, or if ``max_lifetime`` is used up; NotHeld if
        released.
        """
        # check(), inlined, sharing its clock reading with the round trip's start.
        if self._pid != _pid:
            self._own()
        if self._lost_reason is not None:
            raise LeaseLost(self.name, self._lost_reason)
        if self._released:
            raise NotHeld(self.name, "already released")
        keeper = self._keeper
        now = keeper.clock()
        if now >= self._safe_until:
            raise LeaseLost(self.name, "safe-until passed without a confirmed renewal")
        if self.max_lifetime is None:  # _renewal_ttl(now) is the TTL: reuse its argument
            ttl = self.ttl
            ttl_ms = self._ttl_ms
            if ttl_ms is None:
                ttl_ms = self._ttl_ms = b"%d" % _ms(ttl)
        else:
            capped = self._renewal_ttl(now)
            if capped is None:
                raise LeaseLost(self.name, "max lifetime reached")
            ttl, ttl_ms = capped, b"%d" % _ms(capped)
        beats = self._beats
        scripts = self._owner._scripts
        renewed = scripts.run(scripts.renew, [self._key], [self.token, ttl_ms]) == 1
        keeper.confirm(self, ttl, beats, now, renewed)
        if self._lost_reason is not None:
            raise LeaseLost(self.name, self._lost_reason)

    def release(self) -> None:
        """Give the lease up: renewal stops at once, then one round trip deletes it if ours.

        Raises NotHeld if already released (or held by the parent of this forked process);
        LeaseLost if the token no longer matched in Redis (it expired, or someone else holds
        it): nothing is deleted then. A Redis error propagates; the lease then lapses by TTL.
        """
        if self._pid != _pid:
            self._own()
        keeper = self._keeper
        if not keeper.begin_release(self):  # marks it released and stops renewing it
            raise NotHeld(self.name, "already released")
        key = self._key
        tagged = key[_LEASE_PREFIX_LEN:]  # waiting_key(name), wake_key(name), as bytes
        keys = [key, _WAITING_PREFIX + tagged, _WAKE_PREFIX + tagged]
        scripts = self._owner._scripts
        if scripts.run(scripts.release, keys, [self.token, _WAKE_TTL]) != 1:
            keeper.lose(self, "release refused: the token no longer matches")
            raise_refused("release", self.name)
        keeper.counters.incr("released")
        log.debug("lease %r (fence %d) released", self.name, self.fence)

    def on_lost(self, callback: Callable[[Lease], object]) -> None:
        """Call ``callback(lease)`` when the lease is lost: in the keeper's thread, or in the
        thread whose renew/release found it lost, or at once if it already is. What the
        callback raises is logged, never raised."""
        with self._keeper._lock:
            if self._lost_reason is None:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        run_callback(callback, self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release. Its LeaseLost or NotHeld is swallowed only if the lease was already lost
        when the block ended (so the block had its chance to notice); a loss the release
        itself discovers is raised."""
        already_lost = self.lost
        try:
            self.release()
        except (LeaseLost, NotHeld):
            if not already_lost:
                raise

    # -- used by the Keeper (under its lock) ----------------------------------------------

    def _own(self) -> None:
        if self._pid != _pid:
            raise NotHeld(self.name, "acquired by another process (inherited through fork)")

    def _margin(self, ttl: float) -> float:
        return ttl * self._owner.drift + FIXED_MARGIN

    def _renewal_ttl(self, now: float) -> float | None:
        """The TTL to ask for at `now`: the lease TTL, capped so the lease ends by its max
        lifetime; None once that leaves nothing worth renewing."""
        if self.max_lifetime is None:
            return self.ttl
        ttl = min(self.ttl, self._acquired_at + self.max_lifetime - now)
        return ttl if ttl > self._margin(ttl) + MIN_WAIT else None

    def _confirm(self, start: float, ttl: float, beats: int) -> None:
        """Redis confirmed a renewal to `ttl` whose round trip started at `start`. (Rounds may
        be answered out of order: keep the latest of each.)"""
        if start > self._renewed_at:
            self._renewed_at = start
        safe_until = safe_deadline(start, ttl, self._owner.drift)
        if safe_until > self._safe_until:
            self._safe_until = safe_until
        if beats > self._beats_seen:
            self._beats_seen = beats
        self._awaiting_beat = False


class Leases:
    """Hands out leases on one Redis client, with one Keeper renewing them.

    Acquire is one script: ``SET lease:{NAME} token NX PX ttl`` and ``INCR fence:{NAME}``, so
    every acquire returns a strictly larger fence. Renew and release are scripts that compare
    the token first; a wrong token changes nothing. `clock` (monotonic seconds) is the only
    source of time, so tests can inject a fake one; `drift` is the fraction of the TTL (plus
    FIXED_MARGIN) by which safe-until precedes Redis's expiry.

    Blocking acquire does not poll. The refused acquire raises ``lease-waiting:{NAME}`` and
    returns the holder's remaining TTL in the same round trip; the waiter BLPOPs
    ``lease-wake:{NAME}`` for at most min(remaining timeout, that TTL), and retries when woken::

        waiter  acquire -> {pttl=1800}, flag set      BLPOP lease-wake:{n} (<= 1.8 s) ... woken
        holder                                  release: DEL lease; flag set -> RPUSH wake ^

    A release between the waiter's refused acquire and its BLPOP leaves the marker in the list
    (for WAKE_TTL_MS), so the waiter returns at once. A holder that dies without releasing
    lets its key expire, which the waiter's TTL-bounded BLPOP covers. A release nobody waits
    for finds no flag and does no wake-up work.
    """

    def __init__(
        self,
        client: Any,
        clock: Callable[[], float] = time.monotonic,
        drift: float = 0.01,
        keeper: Keeper | None = None,
    ) -> None:
        if not 0.0 <= drift < 0.5:
            raise ValueError(f"drift must be in [0, 0.5), not {drift!r}")
        self._owns_keeper = keeper is None
        self.keeper = Keeper(client, clock=clock) if keeper is None else keeper
        if self.keeper.clock is not clock:
            raise ValueError("a Leases and its Keeper must share one clock")
        self.client = client
        self.clock = clock
        self.drift = drift
        self._scripts = LeaseScripts(client)
        self._wait_cap = _blocking_cap(client)
        self._last_ttl_ms = (DEFAULT_TTL, _ms(DEFAULT_TTL))  # (a TTL, its _ms)

    def acquire(
        self,
        name: str,
        ttl: float = DEFAULT_TTL,
        blocking: bool = False,
        timeout: float | None = None,
        max_lifetime: float | None = None,
        renew: bool = True,
        fence_floor: int = 0,
        progress: bool = True,
        fence_ttl: float | None = None,
    ) -> Lease:
        """Acquire lease `name` for `ttl` seconds; raise NotAcquired if someone else holds it.

        With ``blocking=True``, wait for it (forever if `timeout` is None, else at most
        `timeout` seconds). With ``renew=True`` the keeper renews it while the holder
        heartbeats, for at most `max_lifetime` seconds in all (None: no limit); with
        ``renew=False`` only ``Lease.renew()`` extends it. Either way the keeper reports its
        loss at safe-until. The fence handed out is above `fence_floor`: pass the newest fence
        your store has seen, and a fence counter that Redis lost cannot repeat an old fence.
        With ``progress=False`` the keeper renews it without waiting for heartbeats: it lives
        as long as this process does (a liveness marker, e.g. a rollback journal's owner).
        With `fence_ttl` (seconds) the fence counter expires that long after this acquire
        instead of never: only for a lease whose fence no store relies on (the rollback
        journal fences by token) or whose store passes its newest fence as `fence_floor`.
        """
        if name.__class__ is str and name and "{" not in name and "}" not in name:
            # The common name, without a hash tag of its own: its keys, as lease.keys builds them.
            tagged = "{" + name + "}"
            keys = [LEASE_PREFIX + tagged, FENCE_PREFIX + tagged]
        else:
            validate_name(name)
            keys = [lease_key(name), fence_key(name)]
        if blocking or timeout is not None or max_lifetime is not None or not MIN_TTL <= ttl < _INF:
            _check_durations(ttl, blocking, timeout, max_lifetime)  # else all is well
        first_ttl = ttl if max_lifetime is None else min(ttl, max_lifetime)
        token = _new_token()
        last = self._last_ttl_ms  # callers mostly repeat one TTL: skip round() then
        if last[0] == first_ttl:
            ttl_ms = last[1]
        else:
            ttl_ms = _ms(first_ttl)
            self._last_ttl_ms = (first_ttl, ttl_ms)  # one store: threads see either pair
        args: list[str | int] = [token, ttl_ms]
        if blocking:  # a refusal raises the waiting flag, so the release will wake us
            keys.append(waiting_key(name))
            args += (fence_floor, _ms(self._wait_cap) + WAKE_TTL_MS)
        elif fence_floor or fence_ttl is not None:  # acquire.lua takes an absent floor as 0
            args.append(fence_floor)
        if fence_ttl is not None:
            if not (math.isfinite(fence_ttl) and fence_ttl >= MIN_TTL):
                raise ValueError(f"fence_ttl must be a finite number of seconds >= {MIN_TTL}, "
                                 f"not {fence_ttl!r}")
            if not blocking:
                args.append(0)  # ARGV[4], read only with KEYS[3]
            args.append(_ms(fence_ttl))
        clock = self.clock
        scripts = self._scripts
        deadline = None if timeout is None else clock() + timeout
        while True:
            start = clock()
            reply = scripts.run(scripts.acquire, keys, args)
            if reply.__class__ is not list:  # acquired: the reply is the fence
                lease = Lease(
                    self, name, keys[0], token, reply, ttl, start, first_ttl, max_lifetime, renew,
                    progress,
                )
                self.keeper.track(lease)  # also counts it as acquired
                log.debug("lease %r acquired with fence %d", name, reply)
                return lease
            self.keeper.counters.incr("contended")
            wait = self._wait_time(reply[0], deadline) if blocking else None
            if wait is None:
                raise_refused("acquire", name, f" (waited {timeout} s)" if blocking else "")
            self._do_wait(name, wait)

    def _wait_time(self, holder_pttl_ms: int, deadline: float | None) -> float | None:
        """How long to block for the holder's release; None when the timeout is used up."""
        # +1 ms: wake just after the holder's key expires, not just before.
        wait = (holder_pttl_ms + 1) / 1000.0 if holder_pttl_ms >= 0 else self._wait_cap
        if deadline is not None:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return None
            wait = min(wait, remaining)
        return max(MIN_WAIT, min(wait, self._wait_cap))

    def _do_wait(self, name: str, seconds: float) -> None:
        self.client.blpop([wake_key(name)], timeout=round(seconds, 3))

    def current_fence(self, name: str) -> int:
        """The latest fence handed out for `name` (the current holder's, if held); 0 if none."""
        value = self.client.get(fence_key(validate_name(name)))
        return 0 if value is None else int(value)

    holder_fence = current_fence

    def stats(self) -> LeaseStats:
        """The keeper's counters, renewal round-trip times and margin (a plain dict; see
        lease.stats.LeaseStats). Leases sharing a keeper share its stats."""
        return self.keeper.stats()

    def close(self) -> None:
        """Stop the keeper's threads if this Leases created the keeper."""
        if self._owns_keeper:
            self.keeper.stop()


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _check_durations(
    ttl: float, blocking: bool, timeout: float | None, max_lifetime: float | None
) -> None:
    if not (math.isfinite(ttl) and ttl >= MIN_TTL):
        raise ValueError(f"ttl must be a finite number of seconds >= {MIN_TTL}, not {ttl!r}")
    if timeout is not None:
        if not blocking:
            raise ValueError("timeout needs blocking=True")
        if not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 or None, not {timeout!r}")
    if max_lifetime is not None and not max_lifetime >= MIN_TTL:
        raise ValueError(f"max_lifetime must be >= {MIN_TTL} or None, not {max_lifetime!r}")


def _blocking_cap(client: Any) -> float:
    """The longest BLPOP that cannot trip the client's own socket timeout."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    socket_timeout = kwargs.get("socket_timeout")
    if not socket_timeout:
        return MAX_WAIT
    return max(MIN_WAIT, min(MAX_WAIT, socket_timeout / 2))
