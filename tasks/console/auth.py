"""Who may use the console, and how a request proves it.

- Credentials: CONSOLE_USER and CONSOLE_PASSWORD. Without both the console refuses to start
  (like our Flower, tasks/flowerguard.py). Both are compared with `hmac.compare_digest`, the
  password is never logged, never written into a page and never kept in a cookie.
- Session: a successful login sets a signed cookie (Tornado's `set_signed_cookie`, HMAC with
  CONSOLE_SECRET, or a random secret drawn at each start, so a restart ends every session)
  holding the user, the time of login and a random CSRF token. HttpOnly, SameSite=Strict,
  Secure when served over HTTPS; it expires SESSION_HOURS after login.
- CSRF: every POST but the login itself must carry the session's token (the `X-CSRF-Token`
  header or a `_csrf` form field), compared with `hmac.compare_digest`: 403 otherwise. The
  login form is protected by Tornado's own `_xsrf` double-submit cookie (login CSRF).
- No session: 401 for the JSON API and for any POST, a redirect to the login page for a page.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from tornado.web import HTTPError, RequestHandler

from tasks.settings import Settings

__all__ = ["Credentials", "credentials_from", "cookie_secret", "ConsoleHandler", "REFUSAL",
           "SESSION_COOKIE", "CSRF_HEADER", "CSRF_FIELD", "SESSION_HOURS", "new_session",
           "MissingCredentials"]

REFUSAL = ("CONSOLE_USER and CONSOLE_PASSWORD must be set before starting the console "
           "(it is never started without authentication)")
SESSION_COOKIE = "rk_console"
SESSION_HOURS = 12.0
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "_csrf"

# Sent with every response: no framing, no sniffing, no referrer, scripts and styles from
# the console's own static files only, nothing cached (pages show live state and the token).
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str = field(repr=False)

    def match(self, user: str, password: str) -> bool:
        """Both compared in constant time, both always (no early exit on a wrong user)."""
        same_user = hmac.compare_digest(user.encode(), self.user.encode())
        same_password = hmac.compare_digest(password.encode(), self.password.encode())
        return same_user and same_password


class MissingCredentials(Exception):
    """CONSOLE_USER or CONSOLE_PASSWORD is not set: the console does not start."""


def credentials_from(settings: Settings) -> Credentials:
    """The console's credentials; MissingCredentials (REFUSAL) when either is missing."""
    if not settings.console_user or not settings.console_password:
        raise MissingCredentials(REFUSAL)
    return Credentials(settings.console_user, settings.console_password)


def cookie_secret(settings: Settings) -> str:
    """CONSOLE_SECRET, or a random secret for this process (sessions end with it)."""
    return settings.console_secret or secrets.token_urlsafe(48)


def new_session(user: str) -> dict[str, Any]:
    return {"user": user, "csrf": secrets.token_urlsafe(32), "at": int(time.time())}


class ConsoleHandler(RequestHandler):
    """A handler behind the login: `prepare` turns a missing session into 401 (API, POST) or
    a redirect to the login page, and a POST without the session's CSRF token into 403."""

    # Pages redirect to the login form; the JSON API answers 401.
    api = False

    def set_default_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)

    def session(self) -> dict[str, Any] | None:
        raw = self.get_signed_cookie(SESSION_COOKIE, max_age_days=SESSION_HOURS / 24)
        if raw is None:
            return None
        try:
            found = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(found, dict) or time.time() - found.get("at", 0) > SESSION_HOURS * 3600:
            return None
        return found

    def get_current_user(self) -> str | None:
        found = self.session()
        return str(found["user"]) if found else None

    def check_xsrf_cookie(self) -> None:
        """Tornado's double-submit check is for the login form; behind the login the token is
        the session's own, checked in `prepare` (after the session: 401 comes before 403)."""

    def prepare(self) -> None:
        found = self.session()
        if found is None:
            if self.api or self.request.method != "GET":
                raise HTTPError(401, reason="log in first")
            self.redirect(f"/login?next={quote(self.request.path, safe='/')}")
            return
        if self.request.method not in ("GET", "HEAD"):
            sent = self.request.headers.get(CSRF_HEADER) or self.get_body_argument(
                CSRF_FIELD, "")
            if not sent or not hmac.compare_digest(sent.encode(), str(found["csrf"]).encode()):
                raise HTTPError(403, reason="missing or wrong CSRF token")

    @property
    def csrf_token(self) -> str:
        found = self.session()
        return str(found["csrf"]) if found else ""

    def actor(self) -> str:
        """Who asked, as the run history records it."""
        return f"console:{self.current_user}@{self.request.remote_ip}"

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = self._reason
        if self.api or self.request.method != "GET":
            self.finish({"error": reason, "status": status_code})
        else:
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"{status_code}: {reason}\n")
