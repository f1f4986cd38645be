"""The console's local accounts and what it refuses to start with.

- CONSOLE_USER and CONSOLE_PASSWORD: the operator account, always required (also with proxy
  SSO: the way in when the proxy or its identity provider is down, and for clients that do
  not come through the proxy). Without both the console refuses to start (like our Flower,
  tasks/worker/flowerguard.py).
- CONSOLE_VIEWER_USER and CONSOLE_VIEWER_PASSWORD: an optional account in the role viewer
  (reads everything, changes nothing); both or neither, another user name than the operator's.
- Every password at least MIN_PASSWORD characters, and no password or CONSOLE_SECRET that
  ships in this repository's examples or is a known placeholder (anyone can read those).
- CONSOLE_SSO=proxy: trusted proxies and a group mapping (`tasks.console.sso.sso_from`).

A refusal is one line naming the variable, never quoting a credential. Passwords are
compared with `hmac.compare_digest`, never logged, never written into a page or a cookie.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from tasks.config.envparse import shipped
from tasks.config.settings import Settings
from tasks.console.roles import OPERATOR, VIEWER
from tasks.console.sso import ProxySso, sso_from

__all__ = ["Account", "Accounts", "accounts_from", "check_credentials", "proxy_sso_from",
           "REFUSAL", "MIN_PASSWORD", "ConsoleRefused", "MissingCredentials",
           "ShippedCredential", "WeakPassword"]

REFUSAL = ("CONSOLE_USER and CONSOLE_PASSWORD must be set before starting the console "
           "(it is never started without authentication)")
MIN_PASSWORD = 12


class ConsoleRefused(Exception):
    """The console does not start; the message says why (never quoting a credential)."""


class MissingCredentials(ConsoleRefused):
    """CONSOLE_USER or CONSOLE_PASSWORD is not set (or only one of the viewer's two)."""


class ShippedCredential(ConsoleRefused):
    """A console password or CONSOLE_SECRET is a value anyone can read in this repository (or
    a known placeholder)."""


class WeakPassword(ConsoleRefused):
    """A console password is shorter than MIN_PASSWORD characters."""


@dataclass(frozen=True)
class Account:
    """A local account of the login form."""

    user: str
    password: str = field(repr=False)
    role: str = OPERATOR


@dataclass(frozen=True)
class Accounts:
    """Every local account (the operator's first)."""

    accounts: tuple[Account, ...]

    def match(self, user: str, password: str) -> Account | None:
        """The account with this user and password, or None. Every account's user and
        password are compared, in constant time, whatever matched (no early exit)."""
        found = None
        for account in self.accounts:
            same_user = hmac.compare_digest(user.encode(), account.user.encode())
            same_password = hmac.compare_digest(password.encode(), account.password.encode())
            if same_user and same_password:
                found = account
        return found


def _check_password(name: str, password: str) -> None:
    if shipped(password):
        raise ShippedCredential(
            f"{name} is a value shipped with rangekeeper's examples (or a known "
            "placeholder): anyone can read it. Set one of your own, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    if len(password) < MIN_PASSWORD:
        raise WeakPassword(f"{name} must be at least {MIN_PASSWORD} characters")


def check_credentials(user: str | None, password: str | None, secret: str | None) -> None:
    """Refuse (a `ConsoleRefused`) the operator account and secret the console must not start
    with."""
    if not user or not password:
        raise MissingCredentials(REFUSAL)
    if secret and shipped(secret):
        _check_password("CONSOLE_SECRET", secret)
    _check_password("CONSOLE_PASSWORD", password)


def _viewer(settings: Settings) -> Account | None:
    """The viewer account, if the settings name one; `ConsoleRefused` if it is half set or
    its password would be refused."""
    user, password = settings.console_viewer_user, settings.console_viewer_password
    if not user and not password:
        return None
    if not user or not password:
        raise MissingCredentials("CONSOLE_VIEWER_USER and CONSOLE_VIEWER_PASSWORD are set "
                                 "together or not at all")
    if user == settings.console_user:
        raise ConsoleRefused("CONSOLE_VIEWER_USER must differ from CONSOLE_USER (one user, "
                             "one role)")
    _check_password("CONSOLE_VIEWER_PASSWORD", password)
    if password == settings.console_password:
        raise ConsoleRefused("CONSOLE_VIEWER_PASSWORD must differ from CONSOLE_PASSWORD")
    return Account(user, password, VIEWER)


def accounts_from(settings: Settings) -> Accounts:
    """The console's local accounts, checked (`ConsoleRefused` says what is wrong)."""
    check_credentials(settings.console_user, settings.console_password, settings.console_secret)
    assert settings.console_user and settings.console_password
    operator = Account(settings.console_user, settings.console_password, OPERATOR)
    viewer = _viewer(settings)
    return Accounts((operator, viewer) if viewer else (operator,))


def proxy_sso_from(settings: Settings) -> ProxySso:
    """The proxy SSO the settings ask for; `ConsoleRefused` when it cannot work safely."""
    try:
        return sso_from(settings)
    except ValueError as exc:
        raise ConsoleRefused(str(exc)) from None
