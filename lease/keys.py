"""Every Redis key the lease package touches: prefixes, lifetimes and owners, in one place.

The keys of one lease share the hash tag ``{NAME}`` (the braces are literal), so a lease's
scripts touch a single Redis Cluster slot. A name may instead start with its own hash tag,
``{TAG}REST``: its keys are then ``lease:{TAG}REST``, ``fence:{TAG}REST``..., in the slot of
every other key tagged ``{TAG}``, so a Lua script of the data the lease guards can check the
lease token in the same call (the restock drainer's ``{stock:3}:drain:q1``).
"""

from __future__ import annotations

import re

__all__ = [
    "FENCE_PREFIX",
    "LEASE_PREFIX",
    "WAITING_PREFIX",
    "WAKE_PREFIX",
    "WAKE_TTL_MS",
    "acquire_keys",
    "fence_key",
    "lease_key",
    "release_keys",
    "validate_name",
    "waiting_key",
    "wake_key",
]

# lease:{NAME} -> the holder's random token. TTL: the lease TTL, extended by the holder's
# Keeper while it shows progress. Owner: whoever holds the token; written only by
# lease/lua/{acquire,renew,renew_many,release}.lua, and deleted by lease/lua/revoke.lua for a
# holder known to be gone (Leases.revoke: only the lease of the acquire with that fence).
LEASE_PREFIX = "lease:"

# fence:{NAME} -> integer fencing counter, INCRed by every successful acquire. No TTL: it must
# outlive every durable write it guards (a reset counter would hand out old fences again);
# except when the acquirer passes fence_ttl (a lease whose fence no store relies on, e.g. the
# rollback journal's, fenced by its token in the database): then that TTL from each acquire.
# Owner: lease/lua/acquire.lua; read by anyone (Leases.current_fence).
FENCE_PREFIX = "fence:"

# lease-waiting:{NAME} -> "1" while a blocking acquirer may be waiting for the lease. TTL: the
# waiter's longest single wait + WAKE_TTL_MS, refreshed by each of its refused attempts.
# Owner: set by lease/lua/acquire.lua (blocking callers only), read by release.lua, so an
# uncontended release does no wake-up work.
WAITING_PREFIX = "lease-waiting:"

# lease-wake:{NAME} -> list holding at most one wake marker. TTL: WAKE_TTL_MS. Owner: pushed
# by lease/lua/release.lua when lease-waiting:{NAME} exists, popped (BLPOP) by blocked
# acquirers.
WAKE_PREFIX = "lease-wake:"

# Long enough to cover a waiter's gap between its refused acquire and its BLPOP; short enough
# that a release nobody waited for leaves no lasting trace.
WAKE_TTL_MS = 1000


# A name that carries its own hash tag: "{TAG}" first, then anything without braces.
_TAGGED = re.compile(r"\{[^{}]+\}[^{}]*")


def validate_name(name: str) -> str:
    """Return `name` if it can be a lease name, else raise ValueError.

    A name either has no braces (its keys are tagged with the whole name) or starts with one
    non-empty hash tag ``{TAG}`` and has no other brace. Any other brace would move some of
    the lease's keys to another Redis Cluster slot.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a lease name must be a non-empty string")
    if ("{" in name or "}" in name) and not _TAGGED.fullmatch(name):
        raise ValueError(f"a lease name must have no braces, or start with one hash tag "
                         f"'{{TAG}}' and have no other: {name!r}")
    return name


def _tagged(name: str) -> str:
    return name if name[0] == "{" else f"{{{name}}}"


def lease_key(name: str) -> str:
    """The key holding the token of lease `name`."""
    return LEASE_PREFIX + _tagged(name)


def fence_key(name: str) -> str:
    """The key holding the fencing counter of lease `name`."""
    return FENCE_PREFIX + _tagged(name)


def waiting_key(name: str) -> str:
    """The flag telling a release of lease `name` that someone may be waiting for it."""
    return WAITING_PREFIX + _tagged(name)


def wake_key(name: str) -> str:
    """The list a release of lease `name` pushes a wake marker to."""
    return WAKE_PREFIX + _tagged(name)


# -- the hot paths' keys -------------------------------------------------------------------
# An acquire or release is one round trip; building its keys is overhead on every call, so
# these skip the regex for the common name and build a release's keys without encoding.


def acquire_keys(name: str) -> list[str]:
    """``[lease_key(name), fence_key(name)]``, the acquire's KEYS; ValueError for a bad name."""
    if name.__class__ is str and name and "{" not in name and "}" not in name:
        tagged = "{" + name + "}"  # no hash tag of its own: nothing to validate
        return [LEASE_PREFIX + tagged, FENCE_PREFIX + tagged]
    validate_name(name)
    return [lease_key(name), fence_key(name)]


# Every key of a lease is its prefix + the same tagged name.
_LEASE_PREFIX_LEN = len(LEASE_PREFIX.encode())
_WAITING_PREFIX = WAITING_PREFIX.encode()
_WAKE_PREFIX = WAKE_PREFIX.encode()


def release_keys(key: bytes) -> list[bytes]:
    """The release's KEYS, as bytes, from the encoded `lease_key(name)`: that key, then
    ``waiting_key(name)`` and ``wake_key(name)``."""
    tagged = key[_LEASE_PREFIX_LEN:]
    return [key, _WAITING_PREFIX + tagged, _WAKE_PREFIX + tagged]
