"""Flower fails closed from any working directory.

`flowerconfig.py` is read only from the working directory, so `celery -A tasks flower` started
elsewhere (a systemd unit, another checkout) used to serve every page, task arguments and
`/metrics` on 0.0.0.0 without authentication. The rules are therefore enforced here, from the
package every `celery -A tasks` process imports:

- no basic-auth credentials (FLOWER_BASIC_AUTH=user:password) -> Flower refuses to start;
- a password shipped in this repository's examples or a known placeholder
  (`admin:change-me`) -> Flower refuses to start: anyone can read it;
- no address given (FLOWER_ADDRESS or --address) -> it listens on 127.0.0.1 only, because
  Flower's `/metrics` and `/healthcheck` bypass basic auth.

The check wraps `flower.app.Flower.start_http_server`, which runs after Flower has applied its
environment variables, its configuration file and its command line, and before it binds a socket.
The celery CLI imports Flower's command (an entry point) before it imports this package, so the
wrapper is installed only in processes that can run Flower; other processes import nothing.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["install", "check_options", "check_basic_auth", "FLOWER_DEFAULT_ADDRESS", "REFUSAL",
           "SHIPPED_REFUSAL"]

FLOWER_DEFAULT_ADDRESS = "127.0.0.1"
REFUSAL = ("FLOWER_BASIC_AUTH must be set to user:password before starting Flower "
           "(Flower is never started without authentication)")
SHIPPED_REFUSAL = ("FLOWER_BASIC_AUTH has a password shipped with rangekeeper's examples (or a "
                   "known placeholder): anyone can read it; set a password of your own, e.g. "
                   "python -c 'import secrets; print(secrets.token_urlsafe(24))'")


def check_basic_auth(credentials: list[str] | None) -> None:
    """SystemExit (REFUSAL) unless every entry is `user:password`; SystemExit
    (SHIPPED_REFUSAL) when a password is a shipped or placeholder value."""
    from tasks.config.envparse import shipped

    found = [c for c in (credentials or []) if c and ":" in c]
    if not found or len(found) != len(credentials or []):
        raise SystemExit(REFUSAL)
    if any(shipped(c.split(":", 1)[1]) for c in found):
        raise SystemExit(SHIPPED_REFUSAL)


def check_options(options: Any) -> None:
    """Refuse Flower options without basic auth or with a shipped password; default the
    address to loopback."""
    check_basic_auth(options.basic_auth)
    if not options.address and not options.unix_socket:
        options.address = FLOWER_DEFAULT_ADDRESS


def install() -> None:
    """Wrap Flower's server start once, if this process has Flower loaded (idempotent)."""
    module = sys.modules.get("flower.app")
    if module is None:
        return
    flower_cls = module.Flower
    original = flower_cls.start_http_server
    if getattr(original, "__wrapped__", None) is not None:
        return

    def start_http_server(self: Any) -> Any:
        check_options(self.options)
        return original(self)

    start_http_server.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(flower_cls, "start_http_server", start_http_server)  # noqa: B010
