"""Server-side console sessions: the cookie carries a signed session id,
and the session itself lives in Redis, read on every request.

A session records its user, role (`tasks.console.roles`), how it was opened (the login form or
the trusted proxy, `tasks.console.sso`), its CSRF token and a fingerprint: an HMAC under the
cookie secret, so Redis never holds anything to guess a password from.

- Opened with the login form, the fingerprint covers the account's user, password and role:
  once the console runs with another password (a password change is a restart with a new
  CONSOLE_PASSWORD or CONSOLE_VIEWER_PASSWORD), every older session of that account is refused
  and deleted at its next request.
- Opened through the proxy, it covers the user and the role the proxy's headers gave: the
  session holds only on a request through the proxy that names the same user with the same
  role; another user (or the same one in other groups), or the cookie shown without the proxy,
  ends it.

Logout deletes the session, so a copied cookie stops working with it. A cookie forged with a
known secret names no session the server issued, and gets nowhere either.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable
from typing import Any

from tasks.console.keys import session_key

__all__ = ["Sessions", "SESSION_HOURS"]

SESSION_HOURS = 12.0


class Sessions:
    """Sessions of one console process: its secret, its local accounts (user, password, role),
    a Redis client."""

    def __init__(self, client: Any, secret: str, accounts: Iterable[tuple[str, str, str]],
                 hours: float = SESSION_HOURS) -> None:
        self.client = client
        self.hours = hours
        self._secret = secret.encode()
        self._local = {user: self.fingerprint("password", user, role, password)
                       for user, password, role in accounts}

    def fingerprint(self, method: str, user: str, role: str, proof: str = "") -> str:
        """The HMAC a session of `user` in `role`, opened by `method`, carries."""
        message = "\0".join((method, user, role, proof)).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def create(self, user: str, role: str, method: str,
               fingerprint: str | None = None) -> tuple[str, dict[str, Any]]:
        """A new session: its id (for the cookie) and its record. A login-form session's
        fingerprint is its account's; a proxy session's is given (`fingerprint`)."""
        sid = secrets.token_urlsafe(32)
        record = {"user": user, "role": role, "method": method,
                  "csrf": secrets.token_urlsafe(32), "at": int(time.time()),
                  "credentials": self._local[user] if fingerprint is None else fingerprint}
        self.client.set(session_key(sid), json.dumps(record), ex=int(self.hours * 3600))
        return sid, record

    def find(self, sid: str, proxied: str | None = None) -> dict[str, Any] | None:
        """The session `sid`, or None: unknown, ended or expired. On a request through the
        proxy (`proxied`: the fingerprint its headers give) only that proxy session holds;
        on any other, only a local account's as they are now. A session that does not hold is
        deleted: another password, another proxy user or role, a login-form session shown
        through the proxy, or a proxy session shown without it."""
        raw = self.client.get(session_key(sid))
        try:
            record = json.loads(raw) if raw is not None else None
        except ValueError:
            record = None
        if not isinstance(record, dict):
            return None
        if not self._holds(str(record.get("credentials", "")), proxied):
            self.end(sid)
            return None
        if time.time() - float(record.get("at", 0)) > self.hours * 3600:
            return None
        return record

    def _holds(self, fingerprint: str, proxied: str | None) -> bool:
        """Whether a session with `fingerprint` holds for this request (every comparison in
        constant time, all of them made)."""
        wanted = [proxied] if proxied is not None else list(self._local.values())
        found = [hmac.compare_digest(fingerprint, w) for w in wanted]
        return any(found)

    def end(self, sid: str) -> None:
        """Logout: the session is gone for every copy of its cookie."""
        self.client.delete(session_key(sid))
