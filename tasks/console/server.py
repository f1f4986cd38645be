"""Build the console's Tornado application and serve it until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from pathlib import Path
from typing import Any

from tornado.web import Application, RequestHandler

from tasks.config.settings import Settings
from tasks.console import actions
from tasks.console.accounts import Accounts, accounts_from, proxy_sso_from
from tasks.console.auth import NotFound, cookie_secret
from tasks.console.handlers import ROUTES
from tasks.console.logins import LoginLimiter
from tasks.console.pages import ROUTES as PAGE_ROUTES  # first: its /deadletters is served
from tasks.console.sessions import Sessions

__all__ = ["make_app", "serve", "HERE"]

HERE = Path(__file__).resolve().parent
log = logging.getLogger("tasks.console")
access = logging.getLogger("tornado.access")


def make_app(accounts: Accounts, secret: str, client: Any,
             settings: Settings) -> Application:
    """The console's routes on the local `accounts`, cookies signed with `secret`, sessions
    and login limits on the Redis `client`; cookies, client addresses and proxy SSO as
    `settings` say (CONSOLE_SECURE_COOKIES, CONSOLE_TRUSTED_PROXIES, CONSOLE_SSO...); any
    other path 404 (`NotFound`)."""
    return Application(
        [*PAGE_ROUTES, *ROUTES],  # type: ignore[arg-type]
        default_handler_class=NotFound,
        template_path=str(HERE / "templates"),
        static_path=str(HERE / "static"),
        cookie_secret=secret,
        xsrf_cookies=True,  # the login form's `_xsrf` (behind the login: the session's token)
        xsrf_cookie_kwargs={"httponly": True, "samesite": "Strict"},
        login_url="/login",
        accounts=accounts,
        sessions=Sessions(client, secret, [(a.user, a.password, a.role)
                                           for a in accounts.accounts]),
        sso=proxy_sso_from(settings),
        logins=LoginLimiter(client),
        secure_cookies=settings.console_secure_cookies,
        trusted_proxies=[ipaddress.ip_network(n) for n in settings.console_trusted_proxies],
        log=log,
        autoescape="xhtml_escape",
        compress_response=True,
        log_function=_log_request,
    )


def _log_request(handler: RequestHandler) -> None:
    """Every POST and every error at INFO or above (an audit of what was asked); the pages'
    polling (successful GETs) only at DEBUG, so a open browser does not flood the log."""
    status = handler.get_status()
    level = logging.WARNING if status >= 400 else logging.INFO
    if status < 400 and handler.request.method in ("GET", "HEAD"):
        level = logging.DEBUG
    client = getattr(handler, "client_ip", None)
    access.log(level, "%d %s %s (%s) %.1fms", status, handler.request.method,
               handler.request.path, client() if client else handler.request.remote_ip,
               1000.0 * handler.request.request_time())


def serve(settings: Settings) -> None:
    """Refuse without credentials, with shipped ones, or with proxy SSO that cannot work
    (`ConsoleRefused`); otherwise serve on CONSOLE_ADDRESS and CONSOLE_PORT until SIGTERM or
    SIGINT."""
    from tasks.store.resources import resources_for

    accounts = accounts_from(settings)
    proxy_sso_from(settings)  # refused before anything else is opened
    actions.load_jobs()
    app = make_app(accounts, cookie_secret(settings), resources_for(settings).redis, settings)
    asyncio.run(_serve(app, settings))


async def _serve(app: Application, settings: Settings) -> None:
    server = app.listen(settings.console_port, settings.console_address, xheaders=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    flower = actions.flower_link()
    users = ", ".join(f"{a.user} ({a.role})" for a in app.settings["accounts"].accounts)
    sso = ", SSO through the proxy" if app.settings["sso"].enabled else ""
    log.info("console: serving http://%s:%d/ (users %s%s%s)", settings.console_address,
             settings.console_port, users, sso, f", Flower at {flower}" if flower else "")
    await stop.wait()
    log.info("console: stopping")
    server.stop()
    await server.close_all_connections()
