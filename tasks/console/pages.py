"""The console's run pages, queue view, dead-letter search with its bulk actions, and CSV
upload: their page shells and JSON API (`tasks.console.ops` does the work).

The pages are shells filled from the API by their own scripts (`static/pagekit.js` and one
script per page), refreshed by polling like the rest of the console. `ROUTES` comes before
`tasks.console.handlers.ROUTES` in the application: its `/deadletters` page (the list with a
kind, a search and the bulk actions) is the one served.

Every POST here is guarded by `ConsoleHandler.prepare` like any other (session, CSRF token,
role). The upload streams its body (`stream_request_body`) so that its size is checked
before it is read: a body over MAX_UPLOAD_BYTES is refused with 413 and never buffered whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tornado.httputil import HTTPFile, parse_body_arguments
from tornado.web import HTTPError, RequestHandler, stream_request_body

from tasks.console import ops
from tasks.console.actions import Refused, Unavailable
from tasks.console.auth import blocking
from tasks.console.handlers import ApiHandler, PageHandler

__all__ = ["ROUTES"]


def _reason(exc: Exception) -> str:
    """An HTTP reason phrase: one line, latin-1, bounded."""
    return " ".join(str(exc).split())[:400].encode("latin-1", "replace").decode("latin-1")


class Api(ApiHandler):
    """The console's API answer, with 404 for an unknown job or run."""

    async def answer(self, call: Callable[[], Any]) -> None:
        try:
            await super().answer(call)
        except ops.NotFound as exc:
            raise HTTPError(404, reason=_reason(exc)) from None


class Page(PageHandler):
    """A page shell that first checks (on the thread pool) that what it shows exists: 404
    otherwise."""

    def exists(self, *args: str) -> None:
        """Raise `ops.NotFound` if the page's subject does not exist."""

    async def get(self, *args: str) -> None:  # type: ignore[override]
        try:
            await blocking(lambda: self.exists(*args))
        except ops.NotFound as exc:
            raise HTTPError(404, reason=_reason(exc)) from None
        except (Refused, Unavailable) as exc:
            raise HTTPError(503, reason=_reason(exc)) from None
        super().get(*args)


class RunPage(Page):
    def exists(self, *args: str) -> None:
        ops.run_exists(args[0], int(args[1]))

    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "run.html", {"page": "run", "job": args[0], "run": int(args[1])}


class RunsPage(Page):
    def exists(self, *args: str) -> None:
        ops.known_job(args[0])

    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "runs.html", {"page": "runs", "job": args[0],
                             "csv": ops.known_job(args[0])["csv"]}


class UploadPage(Page):
    def exists(self, *args: str) -> None:
        if not ops.known_job(args[0])["csv"]:
            raise ops.NotFound(f"{args[0]} is not a CSV job: it takes no upload")

    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        found = ops.known_job(args[0])
        return "upload.html", {"page": "upload", "job": found["job"],
                               "fields": found["param_fields"],
                               "max_bytes": ops.MAX_UPLOAD_BYTES}


class QueuesPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "queues.html", {"page": "queues"}


class LettersPage(PageHandler):
    def page(self, *args: str) -> tuple[str, dict[str, Any]]:
        return "letters.html", {"page": "deadletters", "kind": self.get_argument("kind", ""),
                                "search": self.get_argument("search", "")}


class RunApi(Api):
    async def get(self, job: str, number: str) -> None:
        await self.answer(lambda: ops.run_detail(job, int(number)))


class RunsApi(Api):
    async def get(self, job: str) -> None:
        await self.answer(lambda: ops.runs_list(job))


class QueuesApi(Api):
    async def get(self) -> None:
        await self.answer(ops.queues)


class LetterSearchApi(Api):
    async def get(self) -> None:
        kind, search = self._filter()
        await self.answer(lambda: ops.letters_found(kind, search))

    def _filter(self) -> tuple[str | None, str]:
        return self.get_argument("kind", "") or None, self.get_argument("search", "")


class BulkApi(LetterSearchApi):
    """GET: what the filter matches now (the count to confirm, the ids it ends at); POST
    `action` (replay, purge) with that filter, `expected` (the count confirmed) and `upto`."""

    async def get(self) -> None:
        kind, search = self._filter()
        await self.answer(lambda: ops.bulk_preview(kind, search))

    async def post(self) -> None:
        kind = self.get_body_argument("kind", "") or None
        search = self.get_body_argument("search", "")
        action = self.get_body_argument("action", "")
        upto = self.get_body_argument("upto", "")
        expected = self.get_body_argument("expected", "")
        await self.answer(lambda: ops.bulk(action, kind, search, upto, expected))


@stream_request_body
class UploadApi(Api):
    """A CSV job's start with an uploaded input (multipart: `csv`, the file; `param`,
    NAME=VALUE pairs). The CSRF token comes in the X-CSRF-Token header: the form's fields
    are read only after the size check."""

    _chunks: list[bytes]

    async def prepare(self) -> None:
        await super().prepare()
        if self._finished:
            return
        self._chunks = []
        length = self.request.headers.get("Content-Length", "")
        if not length.isdigit():
            raise HTTPError(411, reason="an upload needs its Content-Length")
        self._check_size(int(length))
        self.request.connection.set_max_body_size(ops.MAX_UPLOAD_BYTES)  # type: ignore

    def _check_size(self, size: int) -> None:
        if size > ops.MAX_UPLOAD_BYTES:
            raise HTTPError(413, reason=f"the upload is {size:,} bytes; at most "
                                        f"{ops.MAX_UPLOAD_BYTES:,} are taken")

    def data_received(self, chunk: bytes) -> None:
        # No more than MAX_UPLOAD_BYTES arrive: the connection's limit is set in `prepare`.
        self._chunks.append(chunk)

    async def post(self, job: str) -> None:
        arguments: dict[str, list[bytes]] = {}
        files: dict[str, list[HTTPFile]] = {}
        parse_body_arguments(self.request.headers.get("Content-Type", ""),
                             b"".join(self._chunks), arguments, files)
        uploaded = files.get("csv")
        if not uploaded:
            raise HTTPError(400, reason="no CSV file in the upload (its field is csv)")
        name = uploaded[0].filename.replace("\\", "/").rsplit("/", 1)[-1][:100]
        data = uploaded[0].body
        params = [p.decode("utf-8", "replace") for p in arguments.get("param", []) if p]
        actor = self.actor()
        await self.answer(lambda: ops.start_with_csv(job, actor, name, data, params))


_JOB = r"([A-Za-z0-9_.:-]{1,128})"
_N = r"([0-9]{1,9})"

ROUTES: list[tuple[str, type[RequestHandler]]] = [
    (rf"/jobs/{_JOB}/runs", RunsPage),
    (rf"/jobs/{_JOB}/runs/{_N}", RunPage),
    (rf"/jobs/{_JOB}/upload", UploadPage),
    (r"/queues", QueuesPage),
    (r"/deadletters", LettersPage),
    (rf"/api/jobs/{_JOB}/runs", RunsApi),
    (rf"/api/jobs/{_JOB}/runs/{_N}", RunApi),
    (rf"/api/jobs/{_JOB}/upload", UploadApi),
    (r"/api/queues", QueuesApi),
    (r"/api/deadletters/search", LetterSearchApi),
    (r"/api/deadletters/bulk", BulkApi),
]
