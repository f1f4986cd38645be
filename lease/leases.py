"""`Leases` hands out token-checked, fenced leases on one Redis client, one Keeper renewing them."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from lease.errors import raise_refused
from lease.keeper import Keeper
from lease.keys import WAKE_TTL_MS, acquire_keys, fence_key, validate_name, waiting_key, wake_key
from lease.lease import Lease
from lease.scripts import TOKEN_CHARS, LeaseScripts, ms
from lease.state import LeaseState
from lease.stats import LeaseStats

__all__ = ["DEFAULT_TTL", "MIN_TTL", "Leases"]

log = logging.getLogger("lease")

DEFAULT_TTL = 10.0  # seconds
MIN_TTL = 0.01  # seconds; below this the drift margin eats the lease
# A BLPOP timeout of 0 blocks forever: never ask for less than this.
MIN_WAIT = 0.001  # seconds
# Longest single BLPOP when neither the holder's TTL nor the caller's timeout bounds it.
MAX_WAIT = 10.0  # seconds
_INF = math.inf

# Lease tokens, drawn from os.urandom in batches (one getrandom syscall per _TOKEN_BATCH
# tokens instead of one per acquire: an acquire is one round trip, and what Python does around
# it is overhead on every call). deque.popleft is atomic, so threads need no lock; a forked
# child empties the pool, so it never hands out a token its parent also holds.
_TOKEN_BATCH = 64
_tokens: deque[str] = deque()


def _new_token() -> str:
    """A fresh random token of TOKEN_CHARS hex characters (as secrets.token_hex would make)."""
    try:
        return _tokens.popleft()
    except IndexError:
        raw = os.urandom(TOKEN_CHARS // 2 * _TOKEN_BATCH).hex()
        _tokens.extend([raw[i:i + TOKEN_CHARS] for i in range(TOKEN_CHARS, len(raw), TOKEN_CHARS)])
        return raw[:TOKEN_CHARS]


os.register_at_fork(after_in_child=_tokens.clear)


class Leases:
    """Hands out leases on one Redis client, with one Keeper renewing them.

    Acquire is one script: ``SET lease:{NAME} token NX PX ttl`` and ``INCR fence:{NAME}``, so
    every acquire returns a strictly larger fence. Renew and release are scripts that compare
    the token first; a wrong token changes nothing. `clock` (monotonic seconds) is the only
    source of time, so tests can inject a fake one; `drift` is the fraction of the TTL (plus
    lease.state.FIXED_MARGIN) by which safe-until precedes Redis's expiry.

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
        self._last_ttl_ms = (DEFAULT_TTL, ms(DEFAULT_TTL))  # (a TTL, its ms())

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
        ``renew=False`` only ``Lease.renew()`` extends it. The keeper reports a loss at
        safe-until. The fence handed out is above `fence_floor`: pass the newest fence
        your store has seen, and a fence counter that Redis lost cannot repeat an old fence.
        ``progress=False``: renewed without heartbeats, alive as long as this process (a
        journal owner). `fence_ttl`: the fence counter expires that long after this acquire,
        only for a lease whose fence no store relies on or that passes `fence_floor`.
        """
        keys = acquire_keys(name)  # ValueError for a bad name, before anything else
        if blocking or timeout is not None or max_lifetime is not None or not MIN_TTL <= ttl < _INF:
            _check_durations(ttl, blocking, timeout, max_lifetime)  # else all is well
        first_ttl = ttl if max_lifetime is None else min(ttl, max_lifetime)
        token = _new_token()
        args: list[str | int] = [token, self._ttl_ms(first_ttl)]
        if blocking or fence_floor or fence_ttl is not None:
            self._add_options(name, keys, args, blocking, fence_floor, fence_ttl)
        clock, scripts = self.clock, self._scripts
        deadline = None if timeout is None else clock() + timeout
        while True:
            start = clock()
            reply = scripts.run(scripts.acquire, keys, args)
            if reply.__class__ is not list:  # acquired: the reply is the fence
                state = LeaseState(name, keys[0].encode(), token, reply, ttl, first_ttl, start,
                                   max_lifetime, renew, progress, self.drift)
                lease = Lease(state, self.keeper, scripts)
                self.keeper.track(state, lease)  # also counts it as acquired
                log.debug("lease %r acquired with fence %d", name, reply)
                return lease
            self.keeper.counters.incr("contended")
            wait = self._wait_time(reply[0], deadline) if blocking else None
            if wait is None:
                raise_refused("acquire", name, f" (waited {timeout} s)" if blocking else "")
            self._do_wait(name, wait)

    def _ttl_ms(self, ttl: float) -> int:
        """`ttl` in whole milliseconds; callers mostly repeat one TTL, so skip round() then."""
        last = self._last_ttl_ms
        if last[0] == ttl:
            return last[1]
        ttl_ms = ms(ttl)
        self._last_ttl_ms = (ttl, ttl_ms)  # one store: threads see either pair
        return ttl_ms

    def _add_options(
        self,
        name: str,
        keys: list[str],
        args: list[str | int],
        blocking: bool,
        fence_floor: int,
        fence_ttl: float | None,
    ) -> None:
        """Append acquire.lua's optional KEYS[3] and ARGV[3..5] (see its header)."""
        if blocking:  # a refusal raises the waiting flag, so the release will wake us
            keys.append(waiting_key(name))
            args += (fence_floor, ms(self._wait_cap) + WAKE_TTL_MS)
        elif fence_floor or fence_ttl is not None:  # acquire.lua takes an absent floor as 0
            args.append(fence_floor)
        if fence_ttl is not None:
            if not (math.isfinite(fence_ttl) and fence_ttl >= MIN_TTL):
                raise ValueError(f"fence_ttl must be a finite number of seconds >= {MIN_TTL}, "
                                 f"not {fence_ttl!r}")
            if not blocking:
                args.append(0)  # ARGV[4], read only with KEYS[3]
            args.append(ms(fence_ttl))

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

    def revoke(self, name: str, fence: int) -> bool:
        """End lease `name` for a holder known to be gone, if the lease is still the one
        handed out with `fence`; True if it was. The caller is not the holder: it saw the
        holder's process exit (a worker's main process seeing a pool process die), so nobody
        will renew or release the lease and it would otherwise block everyone for its TTL.

        Only the lease of that acquire ends: a later acquire INCRs the counter past `fence`,
        and a free lease stays free. A revoke frees the lease, nothing more; what the gone
        holder wrote is guarded by `fence` in the store, so a holder that was in fact alive
        writes nothing once the next holder's newer fence is in the store.
        """
        keys = acquire_keys(name)  # ValueError for a bad name
        scripts = self._scripts
        revoked = scripts.run(scripts.revoke, [*keys, waiting_key(name), wake_key(name)],
                              [int(fence), WAKE_TTL_MS]) == 1
        if revoked:
            log.debug("lease %r (fence %d) revoked", name, fence)
        return revoked

    def current_fence(self, name: str) -> int:
        """The latest fence handed out for `name` (the current holder's, if held); 0 if none."""
        value = self.client.get(fence_key(validate_name(name)))
        return 0 if value is None else int(value)

    def stats(self) -> LeaseStats:
        """The keeper's counters, renewal round-trip times and margin (a plain dict; see
        lease.stats.LeaseStats). Leases sharing a keeper share its stats."""
        return self.keeper.stats()

    def close(self) -> None:
        """Stop the keeper's threads if this Leases created the keeper."""
        if self._owns_keeper:
            self.keeper.stop()


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
    # A RedisCluster keeps its connections' options in its nodes manager.
    owner = getattr(client, "connection_pool", None) or getattr(client, "nodes_manager", None)
    kwargs = getattr(owner, "connection_kwargs", {})
    socket_timeout = kwargs.get("socket_timeout")
    if not socket_timeout:
        return MAX_WAIT
    return max(MIN_WAIT, min(MAX_WAIT, socket_timeout / 2))
