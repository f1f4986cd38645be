"""Failed logins, limited per user and per client address with a growing back-off.

A one-second delay after a wrong password slows one client, not forty parallel ones. Each
attempt is counted in Redis by login.lua *before* its password is checked: a user has
FREE_PER_USER attempts and an address FREE_PER_ADDRESS, then each further failure locks the
user or the address out for a back-off that doubles from FIRST_BACKOFF up to MAX_BACKOFF. A
locked-out attempt is answered 429 at once, its password never compared. A success deletes
the counts of its user and its address. Forty parallel guesses from one address thus get
FREE_PER_ADDRESS passwords checked; the others wait for the back-off.

The user's own limit is above the address's, so guessing from one address locks that address
before the user: the operator still logs in from elsewhere. Guessing spread over many
addresses locks the user. The counters live in Redis (several console replicas share them);
every key has a TTL (`tasks.console.keys`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from lease.scripts import load_lua, ms, run_script
from tasks.console.keys import login_keys

__all__ = ["LoginLimiter", "Attempt", "client_key", "FREE_PER_USER", "FREE_PER_ADDRESS",
           "FIRST_BACKOFF", "MAX_BACKOFF", "LOGIN_WINDOW", "FAILURE_DELAY"]

FREE_PER_ADDRESS = 5  # failed logins from one address before its first lockout
FREE_PER_USER = 10  # failed logins for one user (from any address) before its first lockout
FIRST_BACKOFF = 5.0  # seconds; doubled at every further failure
MAX_BACKOFF = 300.0
LOGIN_WINDOW = 3600.0  # the counts are forgotten this long after the last attempt
FAILURE_DELAY = 1.0  # seconds a wrong password waits before its answer

LOGIN = load_lua(__package__, "login")


@dataclass(frozen=True)
class Attempt:
    """What login.lua said: go ahead (`allowed`) or wait `retry_after` seconds. When allowed,
    the failure counts including this attempt, and the lockouts (seconds, 0: none) it set in
    case it fails."""

    allowed: bool
    retry_after: float
    user_failures: int = 0
    user_lockout: float = 0.0
    address_failures: int = 0
    address_lockout: float = 0.0


def client_key(address: str) -> str:
    """The address login limits count: an IPv4 address, or an IPv6 address's /64 (one host
    usually holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # not an IP (a Unix socket's peer): counted as given, bounded
        return address[:64]
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class LoginLimiter:
    """The login limits on one Redis client (the console's REDIS_URL)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._script = client.register_script(LOGIN)

    def attempt(self, user: str, address: str) -> Attempt:
        """Count an attempt of `user` from `address`, or say how long they are locked out."""
        args = [FREE_PER_USER, FREE_PER_ADDRESS, ms(FIRST_BACKOFF), ms(MAX_BACKOFF),
                ms(FAILURE_DELAY), int(LOGIN_WINDOW)]
        reply = run_script(self.client, self._script, login_keys(user, client_key(address)),
                           args)
        allowed, wait_ms, user_n, user_ms, address_n, address_ms = (int(x) for x in reply)
        if not allowed:
            return Attempt(False, wait_ms / 1000)
        return Attempt(True, 0.0, user_n, _backoff(user_ms), address_n, _backoff(address_ms))

    def succeeded(self, user: str, address: str) -> None:
        """The password was right: forget the user's and the address's failures."""
        self.client.delete(*login_keys(user, client_key(address)))


def _backoff(lock_ms: int) -> float:
    """A lockout's back-off in seconds (without the failure delay it also covers)."""
    return max(lock_ms / 1000 - FAILURE_DELAY, 0.0) if lock_ms > 0 else 0.0
