"""Every Redis key of the operator console; nothing else spells them.

    console-session:{SID}            one logged-in session: JSON {user, role, method, csrf,
                                     at, credentials fingerprint}; TTL SESSION_HOURS from
                                     login, deleted by logout and by the first request it does
                                     not hold for (the password changed, the proxy names
                                     another user or role, or a proxy session without it)
    console-login:{console}:fails:user:DIGEST
                                     failed logins for one user name (DIGEST: 16 hex of its
                                     sha256); TTL LOGIN_WINDOW after the last attempt
    console-login:{console}:fails:addr:ADDRESS
                                     failed logins from one client address (IPv6: its /64);
                                     TTL LOGIN_WINDOW after the last attempt
    console-login:{console}:lock:user:DIGEST, ...:lock:addr:ADDRESS
                                     a lockout; PX its back-off plus the failure delay

The login keys share the hash tag `{console}`: login.lua touches four of them at once (one
Redis Cluster slot). The numbers are in `tasks.console.logins`, sessions in
`tasks.console.sessions`; both delete their keys on success or logout, and every key has a TTL.
"""

from __future__ import annotations

import hashlib

__all__ = ["CONSOLE_SESSION_PREFIX", "CONSOLE_LOGIN_PREFIX", "session_key", "login_keys"]

CONSOLE_SESSION_PREFIX = "console-session:"
CONSOLE_LOGIN_PREFIX = "console-login:"


def session_key(sid: str) -> str:
    return f"{CONSOLE_SESSION_PREFIX}{{{sid}}}"


def login_keys(user: str, address: str) -> list[str]:
    """login.lua's KEYS: the user's and the address's failure counts, then their lockouts."""
    digest = hashlib.sha256(user.encode()).hexdigest()[:16]
    tag = f"{CONSOLE_LOGIN_PREFIX}{{console}}"
    return [f"{tag}:fails:user:{digest}", f"{tag}:fails:addr:{address}",
            f"{tag}:lock:user:{digest}", f"{tag}:lock:addr:{address}"]
