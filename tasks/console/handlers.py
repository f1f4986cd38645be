"""The console's pages, its JSON API and its buttons.

Pages are small shells (`templates/`) that `static/console.js` fills from the JSON API and
refreshes every REFRESH_MS without a reload. Every platform call goes through
`tasks.console.actions` on a thread pool (they block on the database and Redis), so a slow
store never stalls the other requests.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from redis.exceptions import RedisError
from tornado.web import HTTPError, RequestHandler

from tasks.console import actions
from tasks.console.accounts import Account, Accounts
from tasks.console.auth import SESSION_COOKIE, SESSION_HOURS, ConsoleHandler, Door, blocking
from tasks.console.logins import FAILURE_DELAY, Attempt, LoginLimiter
from tasks.console.roles import VIEWER, allowed
from tasks.console.sessions import Sessions
from tasks.console.sso import PASSWORD, USER_HEADER, ProxySso
from tasks.console.times import zoned
from tasks.wings import is_enabled

__all__ = ["ROUTES", "REFRESH_MS"]

REFRESH_MS = 1500


class LoginHandler(Door):
    """The login form (protected by Tornado's `_xsrf` cookie) and its check, limited per user
    and per address (`tasks.console.logins`): a locked-out attempt is answered 429 with
    Retry-After, its password never compared."""

    def get(self) -> None:
        sso: ProxySso = self.settings["sso"]
        if sso.enabled and self.from_proxy() and self.request.headers.get(USER_HEADER, ""):
            # The trusted proxy names a user: the page asked for signs them in (a logout's
            # redirect lands here while the proxy still vouches for them).
            self.redirect(_local(self.get_argument("next", "/jobs")))
            return
        self._form("", 200)

    async def post(self) -> None:
        accounts: Accounts = self.settings["accounts"]
        logins: LoginLimiter = self.settings["logins"]
        user = self.get_body_argument("user", "")
        address = self.client_ip()
        try:
            attempt: Attempt = await blocking(lambda: logins.attempt(user, address))
        except (RedisError, OSError):
            raise HTTPError(503, reason="login limits unavailable (Redis does not answer)"
                            ) from None
        if not attempt.allowed:
            wait = max(math.ceil(attempt.retry_after), 1)
            self.set_header("Retry-After", str(wait))
            self._form(f"too many failed logins: try again in {wait} s", 429)
            return
        account = accounts.match(user, self.get_body_argument("password", ""))
        if account is None:
            self._failed(user, address, attempt)
            await asyncio.sleep(FAILURE_DELAY)
            self._form("wrong user or password", 401)
            return
        await self._log_in(account, address)

    def _failed(self, user: str, address: str, attempt: Attempt) -> None:
        log = self.application.settings["log"]
        log.warning("console: failed login for user %r from %s", user[:64], address)
        if attempt.user_lockout:
            log.warning("console: logins locked for %.0fs: user %r after %d failed logins",
                        attempt.user_lockout, user[:64], attempt.user_failures)
        if attempt.address_lockout:
            log.warning("console: logins locked for %.0fs: address %s after %d failed logins",
                        attempt.address_lockout, address, attempt.address_failures)

    async def _log_in(self, account: Account, address: str) -> None:
        logins: LoginLimiter = self.settings["logins"]
        sessions: Sessions = self.settings["sessions"]
        user = account.user
        try:
            await blocking(lambda: logins.succeeded(user, address))
            sid, _ = await blocking(lambda: sessions.create(user, account.role, PASSWORD))
        except (RedisError, OSError):
            raise HTTPError(503, reason="sessions unavailable (Redis does not answer)"
                            ) from None
        self.set_signed_cookie(SESSION_COOKIE, sid, expires_days=SESSION_HOURS / 24,
                               httponly=True, samesite="Strict")
        self.application.settings["log"].info("console: %s logged in from %s as %s", user,
                                              address, account.role)
        self.redirect(_local(self.get_argument("next", "/jobs")))

    def _form(self, error: str, status: int) -> None:
        self.set_status(status)
        self.render("login.html", error=error, next=_local(self.get_argument("next", "/jobs")))


def _local(path: str) -> str:
    """`path` if it is a path of this console, else /jobs (no open redirect)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/jobs"
    return quote(path, safe="/-_.")


class LogoutHandler(ConsoleHandler):
    """Ends the session on the server (every copy of its cookie), then clears the cookie. A
    proxy user's next request through the proxy opens a new session: signing out of the
    identity provider is the proxy's (oauth2-proxy: /oauth2/sign_out)."""

    role_to_change = VIEWER

    async def post(self) -> None:
        sessions: Sessions = self.settings["sessions"]
        sid = self._sid
        if sid is not None:
            try:
                await blocking(lambda: sessions.end(sid))
            except (RedisError, OSError):
                raise HTTPError(503, reason="sessions unavailable (Redis does not answer)"
                                ) from None
        self.clear_cookie(SESSION_COOKIE)
        self.redirect("/login")


class PageHandler(ConsoleHandler):
    """A page shell: the layout, the CSRF token in a meta tag, what the page shows."""

    def get(self, *args: str) -> None:
        template, context = self.page(*args)
        self.render(template, flower=actions.flower_link(), refresh_ms=REFRESH_MS, **context)

    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError


class JobsPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "jobs.html", {"page": "jobs"}


def known(job: str) -> None:
    """404 unless `job` names a registered range job."""
    if not actions.job_known(job):
        raise HTTPError(404, reason=f"no range job {job!r} is registered")


class JobPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        known(args[0])
        shown = "slowest" if self.get_argument("slowest", "") else self.get_argument("state", "")
        return "job.html", {"page": "job", "job": args[0], "verbs": actions.VERBS,
                            "filters": actions.partition_filters(), "shown": shown,
                            "owner": self.get_argument("owner", "")}


def _restock_on() -> None:
    """404 for the restock views while the restock wing is off (WINGS: no tables to read)."""
    if not is_enabled("restock"):
        raise HTTPError(404, reason="the restock wing is off (WINGS)")


class RestockPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        _restock_on()
        return "restock.html", {"page": "restock"}


class LetterPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "letter.html", {"page": "letter", "letter_id": int(args[0])}


class ApiHandler(ConsoleHandler):
    """JSON in, JSON out; a refusal is 409 with the platform's message, an outage 503."""

    api = True

    async def answer(self, call: Callable[[], Any]) -> None:
        try:
            self.write({"ok": True, "data": zoned(await blocking(call))})
        except actions.Refused as exc:
            raise HTTPError(409, reason=_one_line(exc)) from None
        except actions.Unavailable as exc:
            raise HTTPError(503, reason=_one_line(exc)) from None


def _one_line(exc: Exception) -> str:
    """An HTTP reason phrase: one line, no control characters."""
    return " ".join(str(exc).split())[:400].encode("latin-1", "replace").decode("latin-1")


class JobsApi(ApiHandler):
    async def get(self) -> None:
        await self.answer(actions.jobs_overview)


class JobApi(ApiHandler):
    """A job's summary, one page of its partitions and its runs. The page comes from the query
    string (`state`, `owner`, `slowest`, `limit`, `after`: `python -m tasks status`'s flags);
    a value that names no page is 400 with the reason."""

    async def get(self, job: str) -> None:
        known(job)
        try:
            query = actions.partition_query(
                self.get_arguments("state"), self.get_argument("owner", None),
                self.get_argument("slowest", ""), self.get_argument("limit", None),
                self.get_argument("after", None))
        except actions.BadRequest as exc:
            raise HTTPError(400, reason=_one_line(exc)) from None
        role = self.role
        await self.answer(lambda: _with_allowed(actions.job_detail(job, query), role))


def _with_allowed(detail: dict[str, Any], role: str) -> dict[str, Any]:
    """A job's detail with the controls its state allows `role` (`tasks.console.roles`)."""
    return {**detail, "allowed": allowed(detail["job"], role)}


class ControlApi(ApiHandler):
    async def post(self, job: str, verb: str) -> None:
        known(job)
        rate = self.get_body_argument("rows_per_s", None)
        params = self.get_body_arguments("param")  # a start's NAME=VALUE pairs
        actor = self.actor()
        await self.answer(lambda: actions.control(verb, job, actor, rate, params))


class ScheduleApi(ApiHandler):
    """Set or change (`cron`, `policy`, `missed`) or clear (`clear=1`) the job's schedule."""

    async def post(self, job: str) -> None:
        known(job)
        cron = None if self.get_body_argument("clear", "") else self.get_body_argument(
            "cron", "")
        policy = self.get_body_argument("policy", "skip")
        missed = self.get_body_argument("missed", "once")
        actor = self.actor()
        await self.answer(lambda: actions.schedule(job, actor, cron, policy, missed))


class DryRunApi(ApiHandler):
    """What a start with the given parameters would do (`jobs start --dry-run`); reads only,
    so a viewer may ask too."""

    role_to_change = VIEWER

    async def post(self, job: str) -> None:
        known(job)
        params = self.get_body_arguments("param")
        await self.answer(lambda: actions.dry_run(job, params))


class RestockApi(ApiHandler):
    async def get(self) -> None:
        _restock_on()
        await self.answer(actions.restock_overview)


class LettersApi(ApiHandler):
    async def get(self) -> None:
        kind = self.get_argument("kind", "") or None
        await self.answer(lambda: actions.letters(kind))


class LetterApi(ApiHandler):
    async def get(self, letter_id: str) -> None:
        await self.answer(lambda: actions.letter(int(letter_id)))


class ReplayApi(ApiHandler):
    async def post(self, letter_id: str) -> None:
        await self.answer(lambda: actions.replay(int(letter_id)))


class PurgeApi(ApiHandler):
    async def post(self, letter_id: str) -> None:
        await self.answer(lambda: actions.purge(int(letter_id)))


class PurgeOlderApi(ApiHandler):
    async def post(self) -> None:
        older = self.get_body_argument("older_than", "")
        await self.answer(lambda: actions.purge_older(older))


class Home(ConsoleHandler):
    def get(self) -> None:
        self.redirect("/jobs")


_JOB = r"([A-Za-z0-9_.:-]{1,128})"
_ID = r"([0-9]{1,18})"

ROUTES: list[tuple[str, type[RequestHandler]]] = [
    (r"/", Home),
    (r"/login", LoginHandler),
    (r"/logout", LogoutHandler),
    (r"/jobs", JobsPage),
    (rf"/jobs/{_JOB}", JobPage),
    (r"/restock", RestockPage),
    (rf"/deadletters/{_ID}", LetterPage),
    (r"/api/jobs", JobsApi),
    (rf"/api/jobs/{_JOB}", JobApi),
    (rf"/api/jobs/{_JOB}/(start|pause|resume|cancel|retry-failed|retry-skipped|throttle)",
     ControlApi),
    (rf"/api/jobs/{_JOB}/dry-run", DryRunApi),
    (rf"/api/jobs/{_JOB}/schedule", ScheduleApi),
    (r"/api/restock", RestockApi),
    (r"/api/deadletters", LettersApi),
    (r"/api/deadletters/purge", PurgeOlderApi),
    (rf"/api/deadletters/{_ID}", LetterApi),
    (rf"/api/deadletters/{_ID}/replay", ReplayApi),
    (rf"/api/deadletters/{_ID}/purge", PurgeApi),
]
