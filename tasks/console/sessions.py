"""Server-side console sessions: the cookie carries a signed session id,
and the session itself lives in Redis, read on every request.

Logout deletes the session, so a copied cookie stops working with it. Each session records a
fingerprint of the credentials it logged in with (an HMAC under the cookie secret, so Redis
never holds anything to guess the password from): once the console runs with another password
(a password change is a restart with a new CONSOLE_PASSWORD), every older session is refused
and deleted at its next request. A cookie forged with a known secret names no session the
server issued, and gets nowhere either.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import Any

from tasks.console.keys import session_key

__all__ = ["Sessions", "SESSION_HOURS"]

SESSION_HOURS = 12.0


class Sessions:
    """Sessions of one console process: its credentials, its secret, a Redis client."""

    def __init__(self, client: Any, user: str, password: str, secret: str,
                 hours: float = SESSION_HOURS) -> None:
        self.client = client
        self.hours = hours
        self._fingerprint = hmac.new(secret.encode(), f"{user}\0{password}".encode(),
                                     hashlib.sha256).hexdigest()

    def create(self, user: str) -> tuple[str, dict[str, Any]]:
        """A new session of `user`: its id (for the cookie) and its record."""
        sid = secrets.token_urlsafe(32)
        record = {"user": user, "csrf": secrets.token_urlsafe(32), "at": int(time.time()),
                  "credentials": self._fingerprint}
        self.client.set(session_key(sid), json.dumps(record), ex=int(self.hours * 3600))
        return sid, record

    def find(self, sid: str) -> dict[str, Any] | None:
        """The session `sid`, or None: unknown, ended, expired, or of other credentials (then
        deleted)."""
        raw = self.client.get(session_key(sid))
        try:
            record = json.loads(raw) if raw is not None else None
        except ValueError:
            record = None
        if not isinstance(record, dict):
            return None
        if not hmac.compare_digest(str(record.get("credentials", "")), self._fingerprint):
            self.end(sid)
            return None
        if time.time() - float(record.get("at", 0)) > self.hours * 3600:
            return None
        return record

    def end(self, sid: str) -> None:
        """Logout: the session is gone for every copy of its cookie."""
        self.client.delete(session_key(sid))
