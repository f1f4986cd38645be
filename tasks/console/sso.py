"""Single sign-on through a trusted proxy (oauth2-proxy's headers).

With CONSOLE_SSO=proxy, a request whose *peer* (the TCP connection's address, never a header)
is one of CONSOLE_TRUSTED_PROXIES and carries X-Forwarded-User is the request of that user,
with the role its X-Forwarded-Groups (comma separated) map to: `operator` when one group is in
CONSOLE_OPERATOR_GROUPS, else `viewer` when one is in CONSOLE_VIEWER_GROUPS, else none (403).
From any other peer the headers are ignored: they grant nothing, and the local login applies.

The proxy must set these headers itself on every request it forwards, replacing any the
client sent (oauth2-proxy does with `--pass-user-headers`); only X-Forwarded-User and
X-Forwarded-Groups are read, so a header the proxy does not set cannot name anyone.
The identity is checked at every request (`tasks.console.auth.ConsoleHandler`): a session
opened through the proxy holds only while the proxy names the same user with the same role.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from tasks.config.settings import Settings
from tasks.console.roles import OPERATOR, VIEWER

__all__ = ["USER_HEADER", "GROUPS_HEADER", "Identity", "ProxySso", "BadIdentity",
           "sso_from", "PROXY", "PASSWORD"]

USER_HEADER = "X-Forwarded-User"
GROUPS_HEADER = "X-Forwarded-Groups"
# How a session was opened (the audit names it): the local login form, or the proxy.
PASSWORD = "password"
PROXY = "proxy"

# A user name the audit and the page can show as is: printable, no separators that could
# fake another actor, 1-128 characters (an e-mail address fits).
_USER = re.compile(r"[\w.@+=~-][\w.@+=~ -]{0,127}")
_MAX_GROUPS_HEADER = 8192


class BadIdentity(Exception):
    """The proxy's headers name no user the console can record; the message says why."""


@dataclass(frozen=True)
class Identity:
    """Who the proxy says the client is."""

    user: str
    groups: frozenset[str]


@dataclass(frozen=True)
class ProxySso:
    """CONSOLE_SSO=proxy and its group mapping (`enabled` False: headers are never read)."""

    enabled: bool
    operator_groups: frozenset[str] = frozenset()
    viewer_groups: frozenset[str] = frozenset()

    def identity(self, headers: Mapping[str, str]) -> Identity | None:
        """The proxy's user and groups (None when no user is named); `BadIdentity` when the
        headers cannot be recorded. Call it only for a request from a trusted proxy."""
        user = headers.get(USER_HEADER, "").strip()
        if not self.enabled or not user:
            return None
        if not _USER.fullmatch(user):
            raise BadIdentity(f"{USER_HEADER} is not a user name the console can record "
                              "(1-128 letters, digits, spaces and . @ + = ~ _ -)")
        raw = headers.get(GROUPS_HEADER, "")
        if len(raw) > _MAX_GROUPS_HEADER:
            raise BadIdentity(f"{GROUPS_HEADER} is longer than {_MAX_GROUPS_HEADER} characters")
        groups = frozenset(g.strip() for g in raw.split(",") if g.strip())
        return Identity(user, groups)

    def role(self, identity: Identity) -> str | None:
        """The role the identity's groups map to: operator first, then viewer, else None."""
        if identity.groups & self.operator_groups:
            return OPERATOR
        if identity.groups & self.viewer_groups:
            return VIEWER
        return None

    def refusal(self, identity: Identity) -> str:
        """Why `identity` gets no role (the 403's reason; it lists no group of the mapping)."""
        return (f"user {identity.user!r} is in no group this console maps to a role "
                "(CONSOLE_OPERATOR_GROUPS, CONSOLE_VIEWER_GROUPS): ask an administrator")


def sso_from(settings: Settings) -> ProxySso:
    """The proxy SSO the settings ask for; `ValueError` (one line) when it cannot work: on
    without trusted proxies (anyone could send the header) or without any group mapped."""
    if settings.console_sso != PROXY:
        return ProxySso(False)
    if not settings.console_trusted_proxies:
        raise ValueError("CONSOLE_SSO=proxy needs CONSOLE_TRUSTED_PROXIES (the proxies' "
                         "addresses): without them any client could name itself in "
                         f"{USER_HEADER}")
    if not settings.console_operator_groups and not settings.console_viewer_groups:
        raise ValueError("CONSOLE_SSO=proxy needs CONSOLE_OPERATOR_GROUPS or "
                         "CONSOLE_VIEWER_GROUPS (which groups get which role)")
    return ProxySso(True, frozenset(settings.console_operator_groups),
                    frozenset(settings.console_viewer_groups))
