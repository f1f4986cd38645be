"""A `Lease`: one held lease, as its holder sees it. `lease.leases.Leases` hands them out."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from types import TracebackType

from lease.errors import LeaseLost, NotHeld, raise_refused
from lease.keeper import Keeper
from lease.keys import WAKE_TTL_MS, release_keys
from lease.scripts import LeaseScripts, ms
from lease.state import LeaseState

__all__ = ["Lease"]

log = logging.getLogger("lease")

# This process's id, refreshed in a forked child: os.getpid() is a syscall, and every Lease
# method checks it (a Lease belongs to the process that acquired it).
_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)

# Release's wake-marker TTL argument, encoded once: a release is one round trip, and what
# Python does around it is overhead on every call.
_WAKE_TTL = str(WAKE_TTL_MS).encode()


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

    __slots__ = ("_keeper", "_key", "_pid", "_scripts", "_state", "_ttl_ms", "fence", "name",
                 "token", "ttl")

    def __init__(self, state: LeaseState, keeper: Keeper, scripts: LeaseScripts) -> None:
        self.name = state.name
        self.token = state.token
        self.fence = state.fence
        self.ttl = state.ttl
        self._state = state  # renewal state: the keeper writes it, the lease reads it
        self._keeper = keeper
        self._scripts = scripts  # its Leases' scripts
        self._key = state.key  # bytes: lease_key(name)
        self._pid = _pid
        self._ttl_ms: bytes | None = None  # the (fixed) `ttl` as renew's argument; lazy

    def __repr__(self) -> str:
        state = self._state
        status = "lost" if state.lost_reason else "released" if state.released else "held"
        return f"<Lease {self.name!r} fence={self.fence} ttl={self.ttl} {status}>"

    @property
    def max_lifetime(self) -> float | None:
        """Seconds after the acquire beyond which the lease is not renewed (None: no limit)."""
        return self._state.max_lifetime

    @property
    def renews(self) -> bool:
        """True if the keeper renews the lease while it shows progress."""
        return self._state.renews

    @property
    def progress(self) -> bool:
        """False: renewed without heartbeats, so the lease lives exactly as long as its process
        (and its keeper) does; a marker of liveness rather than of progress."""
        return self._state.progress

    @property
    def safe_until(self) -> float:
        """Local (injected clock) deadline until which the lease is surely still ours."""
        return self._state.safe_until

    @property
    def lost_event(self) -> threading.Event:
        """Set once the lease is lost (by the keeper, or a refused renew/release)."""
        return self._keeper.lost_event(self._state)

    @property
    def lost(self) -> bool:
        """True once the lease is marked lost, or is held and past its safe-until."""
        state = self._state
        if state.lost_reason is not None:
            return True
        return not state.released and self._keeper.clock() >= state.safe_until

    @property
    def _lost_reason(self) -> str | None:
        """Why the lease was marked lost; None while it is not."""
        return self._state.lost_reason

    def heartbeat(self) -> None:
        """Record progress (no I/O): the keeper renews the lease at its next due tick.

        Without a heartbeat since the last renewal the keeper lets the lease lapse, so a hung
        holder loses it within about one TTL.
        """
        if self._pid != _pid:
            self._own()
        self._keeper.heartbeat(self._state)

    def check(self) -> None:
        """Raise LeaseLost if the lease is lost or past safe-until, NotHeld if released (no I/O).

        Call it before each unit of work: it is the holder's last line of defence when the
        keeper could not warn it in time.
        """
        self._checked_now()

    def _checked_now(self) -> float:
        """check(), returning the clock reading it compared with safe-until."""
        if self._pid != _pid:
            self._own()
        state = self._state
        if state.lost_reason is not None:
            raise LeaseLost(self.name, state.lost_reason)
        if state.released:
            raise NotHeld(self.name, "already released")
        now = self._keeper.clock()
        if now >= state.safe_until:
            raise LeaseLost(self.name, "safe-until passed without a confirmed renewal")
        return now

    def renew(self) -> None:
        """Extend the lease by its TTL now, in one round trip (the keeper normally does this).

        Raises LeaseLost if Redis refuses (the token no longer matches; the lease is then
        marked lost), if it was already lost, or if ``max_lifetime`` is used up; NotHeld if
        released.
        """
        now = self._checked_now()  # its clock reading is the round trip's start
        state = self._state
        keeper = self._keeper
        if state.max_lifetime is None:  # renewal_ttl(now) is the TTL: reuse its argument
            ttl = self.ttl
            ttl_ms = self._ttl_ms
            if ttl_ms is None:
                ttl_ms = self._ttl_ms = b"%d" % ms(ttl)
        else:
            capped = state.renewal_ttl(now)
            if capped is None:
                raise LeaseLost(self.name, "max lifetime reached")
            ttl, ttl_ms = capped, b"%d" % ms(capped)
        beats = state.beats
        scripts = self._scripts
        renewed = scripts.run(scripts.renew, [self._key], [self.token, ttl_ms]) == 1
        keeper.confirm(state, ttl, beats, now, renewed)
        if state.lost_reason is not None:
            raise LeaseLost(self.name, state.lost_reason)

    def release(self) -> None:
        """Give the lease up: renewal stops at once, then one round trip deletes it if ours.

        Raises NotHeld if already released (or held by the parent of this forked process);
        LeaseLost if the token no longer matched in Redis (it expired, or someone else holds
        it): nothing is deleted then. A Redis error propagates; the lease then lapses by TTL.
        """
        if self._pid != _pid:
            self._own()
        keeper = self._keeper
        state = self._state
        if not keeper.begin_release(state):  # marks it released and stops renewing it
            raise NotHeld(self.name, "already released")
        scripts = self._scripts
        if scripts.run(scripts.release, release_keys(self._key), [self.token, _WAKE_TTL]) != 1:
            keeper.lose(state, "release refused: the token no longer matches")
            raise_refused("release", self.name)
        keeper.counters.incr("released")
        log.debug("lease %r (fence %d) released", self.name, self.fence)

    def on_lost(self, callback: Callable[[Lease], object]) -> None:
        """Call ``callback(lease)`` when the lease is lost: in the keeper's thread, or in the
        thread whose renew/release found it lost, or at once if it already is. What the
        callback raises is logged, never raised."""
        self._keeper.on_lost(self._state, callback)

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

    def _own(self) -> None:
        if self._pid != _pid:
            raise NotHeld(self.name, "acquired by another process (inherited through fork)")
