"""The operator console over HTTP (issue 12), started as a real `python -m tasks console`:
it refuses to start without credentials, binds 127.0.0.1 by default, answers 401 without a
session and 403 to a POST without the CSRF token issued at login, and no credential appears
in any page, any response header or its log."""

from __future__ import annotations

import functools
import http.client
import http.cookiejar
import json
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests import WORKER_REDIS_URL
from tests.support.redis_server import free_port
from tests.support.workers import ROOT, Proc, platform_env, wait_until
from tests.test_flower import listening_addresses

CONSOLE = [sys.executable, "-m", "tasks", "console"]
USER = "operator"
PASSWORD = "pw-Zq81-never-shown"
FLOWER_PASSWORD = "flower-pw-4242"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _FromAddress(urllib.request.HTTPHandler):
    """Connects from a given local address (127.0.0.2 ...: another client on this host)."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def http_open(self, req: Any) -> Any:
        connect = functools.partial(http.client.HTTPConnection, source_address=(self.source, 0))
        return self.do_open(connect, req)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str
    cookies: list[str]  # every Set-Cookie header

    def json(self) -> Any:
        return json.loads(self.body)


class Browserless:
    """An HTTP client with its own cookie jar that does not follow redirects; `source` is the
    local address it connects from (default: the system's choice, 127.0.0.1)."""

    def __init__(self, base: str, source: str | None = None) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        handlers: list[Any] = [urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()]
        if source is not None:
            handlers.append(_FromAddress(source))
        self.opener = urllib.request.build_opener(*handlers)

    def request(self, path: str, data: dict[str, str] | None = None,
                headers: dict[str, str] | None = None, method: str | None = None) -> Answer:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        request = urllib.request.Request(self.base + path, data=body, headers=headers or {},
                                         method=method or ("POST" if body is not None else "GET"))
        try:
            with self.opener.open(request, timeout=30) as response:
                return Answer(response.status, dict(response.headers),
                              response.read().decode(), response.headers.get_all("Set-Cookie")
                              or [])
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, dict(exc.headers), exc.read().decode(),
                          exc.headers.get_all("Set-Cookie") or [])

    def login_form(self) -> str:
        """GET the login form; its `_xsrf` token (the cookie is in the jar)."""
        form = self.request("/login")
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form.body)
        assert xsrf, form.body
        return xsrf.group(1)

    def login(self, user: str = USER, password: str = PASSWORD,
              headers: dict[str, str] | None = None) -> Answer:
        return self.post_login(self.login_form(), user, password, headers)

    def post_login(self, xsrf: str, user: str = USER, password: str = PASSWORD,
                   headers: dict[str, str] | None = None) -> Answer:
        return self.request("/login", {"_xsrf": xsrf, "user": user, "password": password,
                                       "next": "/jobs"}, headers)

    def csrf(self) -> str:
        page = self.request("/jobs")
        found = re.search(r'name="csrf-token" content="([^"]+)"', page.body)
        assert found, page.body
        return found.group(1)


def console_env(db_path: Path, **overrides: str) -> dict[str, str]:
    """A console's environment: the tests' worker Redis, a migrated SQLite file."""
    from tasks.store.migrate import upgrade
    from tasks.store.resources import make_engine

    url = f"sqlite:///{db_path}"
    if not db_path.exists():
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
    env = platform_env(REDIS_URL=WORKER_REDIS_URL, DATABASE_URL=url, CONSOLE_USER=USER,
                       CONSOLE_PASSWORD=PASSWORD, CONSOLE_PORT=str(free_port()))
    for name in ("CONSOLE_ADDRESS", "CONSOLE_SECRET", "FLOWER_URL"):
        env.pop(name, None)
    env.update(overrides)
    return env


def start_console(env: dict[str, str]) -> tuple[Proc, str]:
    proc = Proc(CONSOLE, env, "console")
    proc.wait_for("console: serving", timeout=60)
    return proc, f"http://127.0.0.1:{env['CONSOLE_PORT']}"


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, str, Path]]:
    db = tmp_path_factory.mktemp("console") / "console.sqlite"
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    env = console_env(db, FLOWER_URL=f"http://admin:{FLOWER_PASSWORD}@127.0.0.1:5555")
    proc, base = start_console(env)
    yield proc, base, db
    proc.stop()


def test_the_console_refuses_to_start_without_credentials(tmp_path: Path) -> None:
    env = console_env(tmp_path / "c.sqlite")
    for missing in ("CONSOLE_USER", "CONSOLE_PASSWORD"):
        without = {k: v for k, v in env.items() if k != missing}
        done = subprocess.run(CONSOLE, env=without, cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode != 0, done.stdout + done.stderr
        assert "CONSOLE_USER and CONSOLE_PASSWORD must be set" in done.stderr
        assert PASSWORD not in done.stdout + done.stderr


def test_the_console_binds_loopback_by_default(console: tuple[Proc, str, Path]) -> None:
    _, base, _ = console
    port = int(base.rsplit(":", 1)[1])
    assert listening_addresses(port) == {"127.0.0.1"}


def test_without_a_session_pages_redirect_to_login_and_the_api_answers_401(
    console: tuple[Proc, str, Path]
) -> None:
    _, base, _ = console
    anonymous = Browserless(base)
    for path in ("/api/jobs", "/api/jobs/cm_data", "/api/restock", "/api/deadletters",
                 "/api/deadletters/1"):
        assert anonymous.request(path).status == 401, path
    page = anonymous.request("/jobs/cm_data")
    assert page.status == 302 and page.headers["Location"].startswith("/login?next=/jobs")
    # A POST without a session is refused before its CSRF token is even looked at.
    assert anonymous.request("/api/jobs/cm_data/pause", {}, {"X-CSRF-Token": "x"}).status == 401
    wrong = anonymous.login(password="not-the-password")
    assert wrong.status == 401 and "wrong user or password" in wrong.body
    assert anonymous.request("/api/jobs").status == 401


def test_a_post_without_the_csrf_token_of_the_session_is_403(
    console: tuple[Proc, str, Path]
) -> None:
    _, base, _ = console
    operator = Browserless(base)
    assert operator.login().status == 302
    token = operator.csrf()
    assert operator.request("/api/jobs/cm_data/pause", {}).status == 403
    assert operator.request("/api/jobs/cm_data/pause", {},
                            {"X-CSRF-Token": "forged"}).status == 403
    assert operator.request("/api/deadletters/1/purge", {"_csrf": "forged"}).status == 403
    other = Browserless(base)
    assert other.login().status == 302
    # Another session's token does not do either: the token is bound to its session.
    assert operator.request("/api/jobs/cm_data/pause", {},
                            {"X-CSRF-Token": other.csrf()}).status == 403
    # With the token the request reaches the controls, which refuse: the job never ran.
    refused = operator.request("/api/jobs/cm_data/pause", {}, {"X-CSRF-Token": token})
    assert refused.status == 409
    assert "has no run" in refused.json()["error"]
    assert operator.request("/api/jobs/cm_data/pause", {"_csrf": token}).status == 409
    assert operator.request("/logout", {"_csrf": token}).status == 302
    assert operator.request("/api/jobs").status == 401


def test_no_credential_in_any_page_header_or_the_log(console: tuple[Proc, str, Path]) -> None:
    from sqlalchemy.orm import sessionmaker

    from tasks.deadletters.store import DeadLetters
    from tasks.store.resources import make_engine

    proc, base, db = console
    engine = make_engine(f"sqlite:///{db}")
    # A letter whose payload carries the same password: shown, it is hidden like any other.
    DeadLetters(sessionmaker(engine)).add("task", "t-1", "boom", {
        "task": "devtools.samples.nap", "args": [0.1],
        "kwargs": {"password": PASSWORD}, "url": f"redis://:{PASSWORD}@h:6379/0"})
    engine.dispose()
    operator = Browserless(base)
    assert operator.login().status == 302
    letter_id = operator.request("/api/deadletters").json()["data"]["letters"][0]["id"]
    shown = operator.request(f"/api/deadletters/{letter_id}").json()["data"]
    assert '"password": "***"' in shown["payload"] and ":***@h:6379" in shown["payload"]
    pages = ["/login", "/jobs", "/jobs/cm_data", "/restock", "/deadletters",
             f"/deadletters/{letter_id}", "/api/jobs", "/api/jobs/cm_data", "/api/restock",
             f"/api/deadletters/{letter_id}", "/static/console.js", "/static/console.css"]
    for path in pages:
        answer = operator.request(path)
        assert answer.status == 200, (path, answer.status, answer.body[:300])
        seen = answer.body + json.dumps(answer.headers)
        assert PASSWORD not in seen and FLOWER_PASSWORD not in seen, path
    assert 'href="http://127.0.0.1:5555"' in operator.request("/jobs").body
    operator.login(password="a-wrong-password-typed")
    proc.stop()
    log = proc.log.read_text(errors="replace")
    assert "failed login for user 'operator'" in log
    for secret in (PASSWORD, FLOWER_PASSWORD, "a-wrong-password-typed"):
        assert secret not in log
    wait_until(lambda: proc.popen.poll() is not None, 5, "the console stopped")


def test_the_api_serialises_the_views_the_cli_draws() -> None:
    """The console's job and partition objects are the wing's own views as `status --json`
    writes them, plus what a bar needs (share, rows/s to one decimal, the ETA as text)."""
    from datetime import datetime

    from tasks.console.actions import _summary_json
    from tasks.ranges.status import JobSummary, PartitionView

    summary = JobSummary("j", "running", 40, 50, 100, 10.26, 125.0, {"running": 1}, 3, 20.0)
    shown = _summary_json(summary)
    assert shown == {**summary.as_dict(), "share": 0.5, "rows_per_s": 10.3, "eta": "2m05s"}
    assert _summary_json(JobSummary.never_started("k")) == {
        "job": "k", "state": "never started", "run": None, "rows_done": 0, "ids_walked": 0,
        "ids_planned": 0, "share": 0.0, "rows_per_s": 0.0, "eta": "-", "eta_s": None,
        "throttle_rows_per_s": None, "partitions": {}, "states": {}, "rows_skipped": 0}
    view = PartitionView("j", 0, 1, 100, "running", "w@h:1", 51, 40, 10.0, 3, 2, None,
                         datetime(2026, 1, 2, 3, 4, 5))
    assert view.as_dict()["heartbeat_at"] == "2026-01-02T03:04:05Z"
    assert (view.share, view.as_dict()["takeovers"]) == (0.5, 1)


def test_start_takes_run_parameters_a_dry_run_writes_nothing_and_schedules_are_set(
    tmp_path: Path
) -> None:
    """The job page's start form: parameters checked before anything is written, stored on
    the run; its dry run answers the plan and writes no run."""
    from examples.seed import seed_cm_data
    from examples.tables import migrate
    from tasks.store.resources import make_engine
    from tests import SAMPLE_MODULES

    db = tmp_path / "params.sqlite"
    env = console_env(db, EXTRA_TASK_MODULES=f"{SAMPLE_MODULES},tests.support.param_jobs")
    engine = make_engine(f"sqlite:///{db}")
    migrate(engine)
    seed_cm_data(engine, 90)
    engine.dispose()
    proc, base = start_console(env)
    try:
        operator = Browserless(base)
        assert operator.login().status == 302
        token = {"X-CSRF-Token": operator.csrf()}
        detail = operator.request("/api/jobs/cm_sliced")
        assert detail.status == 200, (detail.status, detail.body)
        fields = detail.json()["data"]["param_fields"]
        assert {"name": "modulo", "type": "int", "required": True} in fields
        assert {"name": "label", "type": "str", "required": False} in fields

        bad = operator.request("/api/jobs/cm_sliced/dry-run", {"param": "modulo=x"}, token)
        assert bad.status == 409 and "modulo" in bad.json()["error"]
        plan = operator.request("/api/jobs/cm_sliced/dry-run", {"param": "modulo=3"}, token)
        assert plan.status == 200, plan.body
        assert plan.json()["data"]["estimated_rows"] == 30  # ids 3, 6, ... 90
        assert operator.request("/api/jobs/cm_sliced").json()["data"]["runs"] == []

        missing = operator.request("/api/jobs/cm_sliced/start", {}, token)
        assert missing.status == 409 and "modulo" in missing.json()["error"]
        assert operator.request("/api/jobs/cm_sliced").json()["data"]["runs"] == []
        body = urllib.parse.urlencode([("param", "modulo=4"), ("param", "label=web")]).encode()
        request = urllib.request.Request(base + "/api/jobs/cm_sliced/start", data=body,
                                         headers=token, method="POST")
        with operator.opener.open(request, timeout=30) as response:
            assert response.status == 200
        runs = operator.request("/api/jobs/cm_sliced").json()["data"]["runs"]
        assert len(runs) == 1 and runs[0]["params"]["modulo"] == 4
        assert runs[0]["params"]["label"] == "web"
        # retry-skipped is reachable (a refusal, not a 404: no skipped rows).
        assert operator.request("/api/jobs/cm_sliced/retry-skipped", {}, token).status == 409
        # The schedule: refused as the CLI refuses it, set, shown, cleared.
        bad_cron = operator.request("/api/jobs/cm_noted/schedule", {"cron": "61 * * * *"}, token)
        assert bad_cron.status == 409
        assert operator.request("/api/jobs/cm_noted").json()["data"]["schedule"] is None
        set_ = operator.request("/api/jobs/cm_noted/schedule",
                                {"cron": "0 2 * * *", "policy": "queue", "missed": "skip"}, token)
        assert set_.status == 200, set_.body
        shown = operator.request("/api/jobs/cm_noted").json()["data"]["schedule"]
        assert (shown["cron"], shown["policy"], shown["missed"]) == ("0 2 * * *", "queue", "skip")
        assert shown["next_due"].endswith("T02:00:00Z") or "02:00:00" in shown["next_due"]
        cleared = operator.request("/api/jobs/cm_noted/schedule", {"clear": "1"}, token)
        assert cleared.status == 200
        assert operator.request("/api/jobs/cm_noted").json()["data"]["schedule"]["cron"] is None
    finally:
        proc.stop()
