"""Who may use the console, and how a request proves it.

- Accounts: the login form's (`tasks.console.accounts`: CONSOLE_USER, an operator, and
  optionally CONSOLE_VIEWER_USER, a viewer), and with CONSOLE_SSO=proxy the users a trusted
  proxy names (`tasks.console.sso`: X-Forwarded-User from a CONSOLE_TRUSTED_PROXIES peer only,
  the role from X-Forwarded-Groups; from any other peer the header is ignored).
- Login: limited per user and per client address (`tasks.console.logins`).
- Session: a successful login, or the first request through the proxy, creates a server-side
  session (`tasks.console.sessions`: user, role, how, CSRF token) and sets a signed cookie
  holding only its id (Tornado's `set_signed_cookie`, HMAC with CONSOLE_SECRET, or a random
  secret drawn at each start, so a restart ends every session). Every request reads the
  session back from Redis: logout and a password change end it for every copy of the cookie,
  and another proxy user ends the proxy session. HttpOnly, SameSite=Strict; Secure over HTTPS,
  behind a trusted proxy that says the client came over HTTPS, or always with
  CONSOLE_SECURE_COOKIES.
- CSRF: every POST but the login itself must carry the session's token (the `X-CSRF-Token`
  header or a `_csrf` form field), compared with `hmac.compare_digest`: 403 otherwise. The
  login form is protected by Tornado's own `_xsrf` double-submit cookie (login CSRF).
- Roles (`tasks.console.roles`): every request but a GET needs the operator role unless its
  handler lowers `role_to_change` (logout, a dry run): a viewer gets 403 and nothing changes.
- No session: 401 for the JSON API and for any POST, a redirect to the login page for a page.
  Redis away: 503 (the console fails closed). An unknown page: 404 (`NotFound`).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from redis.exceptions import RedisError
from tornado.web import HTTPError, RequestHandler

from tasks.config.settings import Settings
from tasks.console.accounts import (
    MIN_PASSWORD,
    REFUSAL,
    Accounts,
    ConsoleRefused,
    MissingCredentials,
    ShippedCredential,
    WeakPassword,
    accounts_from,
    check_credentials,
)
from tasks.console.roles import OPERATOR, may
from tasks.console.sessions import SESSION_HOURS, Sessions
from tasks.console.sso import PROXY, BadIdentity, Identity, ProxySso
from tasks.wings import is_enabled

__all__ = ["Accounts", "accounts_from", "check_credentials", "cookie_secret",
           "ConsoleHandler", "Door", "NotFound", "REFUSAL", "SESSION_COOKIE", "CSRF_HEADER",
           "CSRF_FIELD", "SESSION_HOURS", "MIN_PASSWORD", "ConsoleRefused",
           "MissingCredentials", "ShippedCredential", "WeakPassword", "blocking"]

SESSION_COOKIE = "rk_console"
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


def cookie_secret(settings: Settings) -> str:
    """CONSOLE_SECRET, or a random secret for this process (sessions end with it)."""
    return settings.console_secret or secrets.token_urlsafe(48)


async def blocking(call: Callable[[], Any]) -> Any:
    """Run a blocking call (Redis, the database) on the thread pool."""
    return await asyncio.get_running_loop().run_in_executor(None, call)


class Door(RequestHandler):
    """What every console handler shares: security headers, the client's address and scheme
    (believing X-Forwarded-* from trusted proxies only), Secure cookies when it came over
    HTTPS or the settings say so, and errors as a small page or, for the API and any POST,
    JSON."""

    # Errors as JSON (the API) or as a small page.
    api = False

    def set_default_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.settings["trusted_proxies"])

    def from_proxy(self) -> bool:
        """Whether the request's peer (the connection, never a header) is a trusted proxy."""
        return self._trusted(str(self.request.remote_ip))

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
        if not self.from_proxy():
            return False
        proto = self.request.headers.get("X-Forwarded-Proto", "").split(",")[-1]
        return proto.strip().lower() == "https"

    def set_cookie(self, name: str, value: str | bytes, *args: Any, **kwargs: Any) -> None:
        if self.settings["secure_cookies"] or self.is_https():
            kwargs["secure"] = True
        super().set_cookie(name, value, *args, **kwargs)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """JSON `{error, status}` for the API and any POST; else a small page (no stack)."""
        reason = self._reason
        if self.api or self.request.method not in ("GET", "HEAD") or \
                self.request.path.startswith("/api/"):
            self.finish({"error": reason, "status": status_code})
            return
        self.render("error.html", status=status_code, reason=reason)


class NotFound(Door):
    """Every path no route names (the application's `default_handler_class`): 404."""

    def prepare(self) -> None:
        raise HTTPError(404, reason="no such page in the console")

    def check_xsrf_cookie(self) -> None:
        """A 404 whatever the method: no form to protect."""


class ConsoleHandler(Door):
    """A handler behind the login: `prepare` finds who asks (the trusted proxy's user, or the
    session of the signed cookie's id), turns nobody into 401 (API, POST) or a redirect to the
    login page, a POST without the session's CSRF token into 403, and a change asked by a
    role below `role_to_change` into 403."""

    # The role a request other than GET or HEAD needs (logout and dry runs lower it).
    role_to_change = OPERATOR
    _session: dict[str, Any] | None = None
    _sid: str | None = None

    def _identity(self) -> Identity | None:
        """The user the trusted proxy names (None: SSO off, another peer, or no user)."""
        sso: ProxySso = self.settings["sso"]
        if not sso.enabled or not self.from_proxy():
            return None
        try:
            return sso.identity(self.request.headers)
        except BadIdentity as exc:
            raise HTTPError(400, reason=str(exc)) from None

    async def _read_session(self, proxied: str | None) -> None:
        raw = self.get_signed_cookie(SESSION_COOKIE, max_age_days=SESSION_HOURS / 24)
        if raw is None:
            return
        sid = raw.decode(errors="replace")
        sessions: Sessions = self.settings["sessions"]
        try:
            self._session = await blocking(lambda: sessions.find(sid, proxied))
        except (RedisError, OSError):
            raise HTTPError(503, reason="sessions unavailable (Redis does not answer)") from None
        self._sid = sid if self._session is not None else None

    async def _proxy_session(self, identity: Identity) -> None:
        """The session of the proxy's user: the cookie's if it is this user's in this role,
        else a new one (any other session of the cookie is ended)."""
        sso: ProxySso = self.settings["sso"]
        sessions: Sessions = self.settings["sessions"]
        role = sso.role(identity)
        # An unmapped user ends whatever the cookie held (no role matches "").
        fingerprint = sessions.fingerprint(PROXY, identity.user, role or "")
        await self._read_session(fingerprint)
        if role is None:
            raise HTTPError(403, reason=sso.refusal(identity))
        if self._session is not None:
            return
        try:
            sid, record = await blocking(
                lambda: sessions.create(identity.user, role, PROXY, fingerprint))
        except (RedisError, OSError):
            raise HTTPError(503, reason="sessions unavailable (Redis does not answer)") from None
        self._sid, self._session = sid, record
        self.set_signed_cookie(SESSION_COOKIE, sid, expires_days=SESSION_HOURS / 24,
                               httponly=True, samesite="Strict")
        self.application.settings["log"].info(
            "console: %s signed in through the proxy from %s as %s", identity.user,
            self.client_ip(), role)

    def session(self) -> dict[str, Any] | None:
        return self._session

    def get_current_user(self) -> str | None:
        return str(self._session["user"]) if self._session else None

    @property
    def role(self) -> str:
        return str(self._session.get("role", "")) if self._session else ""

    @property
    def method(self) -> str:
        """How the session was opened: `password` (the login form) or `proxy`."""
        return str(self._session.get("method", "password")) if self._session else ""

    def check_xsrf_cookie(self) -> None:
        """Tornado's double-submit check is for the login form; behind the login the token is
        the session's own, checked in `prepare` (after the session: 401 comes before 403)."""

    async def prepare(self) -> None:
        identity = self._identity()
        if identity is not None:
            await self._proxy_session(identity)
        else:
            await self._read_session(None)
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
            if not may(self.role, self.role_to_change):
                raise HTTPError(403, reason=f"{self.current_user} has the role {self.role}, "
                                f"which changes nothing: this needs the {self.role_to_change} "
                                "role")

    def get_template_namespace(self) -> dict[str, Any]:
        """What base.html needs on every page behind the login (who, the role, how, the CSRF
        token), so a page rendered by any handler has them; `render`'s own values win."""
        return {**super().get_template_namespace(), "user": self.current_user,
                "role": self.role, "how": self.method, "csrf": self.csrf_token,
                "restock_on": is_enabled("restock")}

    @property
    def csrf_token(self) -> str:
        return str(self._session["csrf"]) if self._session else ""

    def actor(self) -> str:
        """Who asked, as the run history records it: the user, the address, the role and how
        the session was opened (`console:alice@10.0.0.7 (operator, proxy)`)."""
        return f"console:{self.current_user}@{self.client_ip()} ({self.role}, {self.method})"
