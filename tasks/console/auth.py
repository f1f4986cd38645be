"""Who may use the console, and how a request proves it.

- Credentials: CONSOLE_USER and CONSOLE_PASSWORD. Without both the console refuses to start
  (like our Flower, tasks/worker/flowerguard.py); so it does with a password or a CONSOLE_SECRET
  that
  ships in this repository's examples or is a known placeholder (anyone can read those), and
  with a password shorter than MIN_PASSWORD. Both are compared with `hmac.compare_digest`; the
  password is never logged, never written into a page and never kept in a cookie.
- Login: limited per user and per client address (`tasks.console.logins`).
- Session: a successful login creates a server-side session (`tasks.console.sessions`) and
  sets a signed cookie holding only its id (Tornado's `set_signed_cookie`, HMAC with
  CONSOLE_SECRET, or a random secret drawn at each start, so a restart ends every session).
  Every request reads the session back from Redis: logout and a password change end it for
  every copy of the cookie. HttpOnly, SameSite=Strict; Secure over HTTPS, behind a trusted
  proxy that says the client came over HTTPS, or always with CONSOLE_SECURE_COOKIES.
- CSRF: every POST but the login itself must carry the session's token (the `X-CSRF-Token`
  header or a `_csrf` form field), compared with `hmac.compare_digest`: 403 otherwise. The
  login form is protected by Tornado's own `_xsrf` double-submit cookie (login CSRF).
- No session: 401 for the JSON API and for any POST, a redirect to the login page for a page.
  Redis away: 503 (the console fails closed).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from redis.exceptions import RedisError
from tornado.web import HTTPError, RequestHandler

from tasks.config.envparse import shipped
from tasks.config.settings import Settings
from tasks.console.sessions import SESSION_HOURS, Sessions

__all__ = ["Credentials", "credentials_from", "check_credentials", "cookie_secret",
           "ConsoleHandler", "Door", "REFUSAL", "SESSION_COOKIE", "CSRF_HEADER", "CSRF_FIELD",
           "SESSION_HOURS", "MIN_PASSWORD", "ConsoleRefused", "MissingCredentials",
           "ShippedCredential", "WeakPassword", "blocking"]

REFUSAL = ("CONSOLE_USER and CONSOLE_PASSWORD must be set before starting the console "
           "(it is never started without authentication)")
SESSION_COOKIE = "rk_console"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "_csrf"
MIN_PASSWORD = 12

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


class ConsoleRefused(Exception):
    """The console does not start; the message says why (never quoting a credential)."""


class MissingCredentials(ConsoleRefused):
    """CONSOLE_USER or CONSOLE_PASSWORD is not set."""


class ShippedCredential(ConsoleRefused):
    """CONSOLE_PASSWORD or CONSOLE_SECRET is a value anyone can read in this repository (or a
    known placeholder)."""


class WeakPassword(ConsoleRefused):
    """CONSOLE_PASSWORD is shorter than MIN_PASSWORD characters."""


def check_credentials(user: str | None, password: str | None, secret: str | None) -> None:
    """Refuse (a `ConsoleRefused`) what the console must not start with."""
    if not user or not password:
        raise MissingCredentials(REFUSAL)
    for name, value in (("CONSOLE_PASSWORD", password), ("CONSOLE_SECRET", secret)):
        if value and shipped(value):
            raise ShippedCredential(
                f"{name} is a value shipped with rangekeeper's examples (or a known "
                "placeholder): anyone can read it. Set one of your own, e.g. "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    if len(password) < MIN_PASSWORD:
        raise WeakPassword(f"CONSOLE_PASSWORD must be at least {MIN_PASSWORD} characters")


def credentials_from(settings: Settings) -> Credentials:
    """The console's credentials, checked by `check_credentials`."""
    check_credentials(settings.console_user, settings.console_password, settings.console_secret)
    assert settings.console_user and settings.console_password
    return Credentials(settings.console_user, settings.console_password)


def cookie_secret(settings: Settings) -> str:
    """CONSOLE_SECRET, or a random secret for this process (sessions end with it)."""
    return settings.console_secret or secrets.token_urlsafe(48)


async def blocking(call: Callable[[], Any]) -> Any:
    """Run a blocking call (Redis, the database) on the thread pool."""
    return await asyncio.get_running_loop().run_in_executor(None, call)


class Door(RequestHandler):
    """What every console handler shares: security headers, the client's address and scheme
    (believing X-Forwarded-* from trusted proxies only), and Secure cookies when it came over
    HTTPS or the settings say so."""

    def set_default_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.settings["trusted_proxies"])

    def client_ip(self) -> str:
        """The client's address: the peer's, or behind trusted proxies the last address of
        X-Forwarded-For that is not one of them."""
        peer = str(self.request.remote_ip)
        if not self._trusted(peer):
            return peer
        hops = [h.strip() for h in self.request.headers.get("X-Forwarded-For", "").split(",")]
        for hop in reversed([h for h in hops if h]):
            try:
                ipaddress.ip_address(hop)
            except ValueError:
                return peer
            if not self._trusted(hop):
                return hop
        return peer

    def is_https(self) -> bool:
        if self.request.protocol == "https":
            return True
        if not self._trusted(str(self.request.remote_ip)):
            return False
        proto = self.request.headers.get("X-Forwarded-Proto", "").split(",")[-1]
        return proto.strip().lower() == "https"

    def set_cookie(self, name: str, value: str | bytes, *args: Any, **kwargs: Any) -> None:
        if self.settings["secure_cookies"] or self.is_https():
            kwargs["secure"] = True
        super().set_cookie(name, value, *args, **kwargs)


class ConsoleHandler(Door):
    """A handler behind the login: `prepare` reads the session (from the signed cookie's id),
    turns a missing one into 401 (API, POST) or a redirect to the login page, and a POST
    without the session's CSRF token into 403."""

    # Pages redirect to the login form; the JSON API answers 401.
    api = False
    _session: dict[str, Any] | None = None
    _sid: str | None = None

    async def _read_session(self) -> None:
        raw = self.get_signed_cookie(SESSION_COOKIE, max_age_days=SESSION_HOURS / 24)
        if raw is None:
            return
        sid = raw.decode(errors="replace")
        sessions: Sessions = self.settings["sessions"]
        try:
            self._session = await blocking(lambda: sessions.find(sid))
        except (RedisError, OSError):
            raise HTTPError(503, reason="sessions unavailable (Redis does not answer)") from None
        self._sid = sid if self._session is not None else None

    def session(self) -> dict[str, Any] | None:
        return self._session

    def get_current_user(self) -> str | None:
        return str(self._session["user"]) if self._session else None

    def check_xsrf_cookie(self) -> None:
        """Tornado's double-submit check is for the login form; behind the login the token is
        the session's own, checked in `prepare` (after the session: 401 comes before 403)."""

    async def prepare(self) -> None:
        await self._read_session()
        found = self._session
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
        return str(self._session["csrf"]) if self._session else ""

    def actor(self) -> str:
        """Who asked, as the run history records it."""
        return f"console:{self.current_user}@{self.client_ip()}"

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = self._reason
        if self.api or self.request.method != "GET":
            self.finish({"error": reason, "status": status_code})
        else:
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"{status_code}: {reason}\n")
