"""The console's pages, its JSON API and its buttons.

Pages are small shells (`templates/`) that `static/console.js` fills from the JSON API and
refreshes every REFRESH_MS without a reload. Every platform call goes through
`tasks.console.actions` on a thread pool (they block on the database and Redis), so a slow
store never stalls the other requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from tornado.web import HTTPError, RequestHandler

from tasks.console import actions
from tasks.console.auth import (
    SECURITY_HEADERS,
    SESSION_COOKIE,
    SESSION_HOURS,
    ConsoleHandler,
    Credentials,
    new_session,
)

__all__ = ["ROUTES", "REFRESH_MS"]

REFRESH_MS = 1500
LOGIN_FAILURE_DELAY = 1.0  # seconds a wrong password waits (slows guessing)


async def _blocking(call: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, call)


class LoginHandler(RequestHandler):
    """The login form (protected by Tornado's `_xsrf` cookie) and its check."""

    def set_default_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)

    def get(self) -> None:
        self._form("", 200)

    async def post(self) -> None:
        credentials: Credentials = self.settings["credentials"]
        user = self.get_body_argument("user", "")
        if not credentials.match(user, self.get_body_argument("password", "")):
            self.application.settings["log"].warning(
                "console: failed login for user %r from %s", user[:64], self.request.remote_ip)
            await asyncio.sleep(LOGIN_FAILURE_DELAY)
            self._form("wrong user or password", 401)
            return
        self.set_signed_cookie(SESSION_COOKIE, _json(new_session(credentials.user)),
                               expires_days=SESSION_HOURS / 24, httponly=True,
                               samesite="Strict", secure=self.request.protocol == "https")
        self.application.settings["log"].info("console: %s logged in from %s",
                                              credentials.user, self.request.remote_ip)
        self.redirect(_local(self.get_argument("next", "/jobs")))

    def _form(self, error: str, status: int) -> None:
        self.set_status(status)
        self.render("login.html", error=error, next=_local(self.get_argument("next", "/jobs")))


def _local(path: str) -> str:
    """`path` if it is a path of this console, else /jobs (no open redirect)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/jobs"
    return quote(path, safe="/-_.")


def _json(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


class LogoutHandler(ConsoleHandler):
    def post(self) -> None:
        self.clear_cookie(SESSION_COOKIE)
        self.redirect("/login")


class PageHandler(ConsoleHandler):
    """A page shell: the layout, the CSRF token in a meta tag, what the page shows."""

    def get(self, *args: str) -> None:
        template, context = self.page(*args)
        self.render(template, user=self.current_user, csrf=self.csrf_token,
                    flower=actions.flower_link(), refresh_ms=REFRESH_MS, **context)

    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError


class JobsPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "jobs.html", {"page": "jobs"}


class JobPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "job.html", {"page": "job", "job": args[0], "verbs": actions.VERBS}


class RestockPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "restock.html", {"page": "restock"}


class LettersPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "letters.html", {"page": "letters", "kind": self.get_argument("kind", "")}


class LetterPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "letter.html", {"page": "letter", "letter_id": int(args[0])}


class ApiHandler(ConsoleHandler):
    """JSON in, JSON out; a refusal is 409 with the platform's message, an outage 503."""

    api = True

    async def answer(self, call: Callable[[], Any]) -> None:
        try:
            self.write({"ok": True, "data": await _blocking(call)})
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
    async def get(self, job: str) -> None:
        await self.answer(lambda: actions.job_detail(job))


class ControlApi(ApiHandler):
    async def post(self, job: str, verb: str) -> None:
        rate = self.get_body_argument("rows_per_s", None)
        actor = self.actor()
        await self.answer(lambda: actions.control(verb, job, actor, rate))


class RestockApi(ApiHandler):
    async def get(self) -> None:
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
    (r"/deadletters", LettersPage),
    (rf"/deadletters/{_ID}", LetterPage),
    (r"/api/jobs", JobsApi),
    (rf"/api/jobs/{_JOB}", JobApi),
    (rf"/api/jobs/{_JOB}/(start|pause|resume|cancel|retry-failed|throttle)", ControlApi),
    (r"/api/restock", RestockApi),
    (r"/api/deadletters", LettersApi),
    (r"/api/deadletters/purge", PurgeOlderApi),
    (rf"/api/deadletters/{_ID}", LetterApi),
    (rf"/api/deadletters/{_ID}/replay", ReplayApi),
    (rf"/api/deadletters/{_ID}/purge", PurgeApi),
]
