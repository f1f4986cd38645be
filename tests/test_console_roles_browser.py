"""Console roles and proxy-header SSO in a real headless Chromium (issue 22), against a real
`python -m tasks console` with a viewer account and CONSOLE_SSO=proxy, a real prefork worker
and a small cm_data job on PostgreSQL (the stack of tests/test_console_browser.py):

- an operator sees exactly the controls the run's state allows as it goes never started ->
  running -> paused -> running -> succeeded; a viewer sees none, and its browser's own POST is
  refused (403) with nothing changed;
- SSO: Chromium cannot add headers, so a tiny loopback reverse proxy (`Relay`, Tornado's HTTP
  client relaying) adds X-Forwarded-User/Groups; connecting from the trusted proxy address it
  logs the browser in with the mapped role, from another address its headers are ignored and
  the login form is shown.

Screenshots go to the test's temporary directory (their paths are printed); a reviewer opens
them to see what each test claims.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httputil import HTTPHeaders
from tornado.web import Application, RequestHandler

from tests import WORKER_REDIS_URL
from tests.support.db import DATABASES, fresh_database
from tests.support.redis_server import free_port
from tests.support.workers import start_worker, wait_until
from tests.test_console_browser import (
    JOB_ENV,
    ROWS,
    Stack,
    _chromium_missing,
    _css,
    _present,
    _press,
    _run_state,
    _wait,
    chromium,
)
from tests.test_console_http import PASSWORD, USER, console_env, start_console
from tests.test_console_roles import PROXY, ROLE_ENV, VIEWER_PASSWORD, VIEWER_USER

SHOWN_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
# Headers a relay does not pass on (hop by hop, or set by its own HTTP client).
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
       "host", "accept-encoding", "te", "upgrade", "proxy-connection"}


class Relay:
    """A reverse proxy on `listen` (a loopback address) that relays every request to
    `upstream`, connecting from `source`, with `add` set on each request (replacing what the
    browser sent), as oauth2-proxy does with X-Forwarded-User/Groups."""

    def __init__(self, upstream: str, source: str, listen: str, add: dict[str, str]) -> None:
        self.upstream, self.source, self.add = upstream, source, add
        self.port = free_port()
        self.base = f"http://{listen}:{self.port}"
        self._listen = listen
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        assert self._ready.wait(10), "the relay did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = Application([(r".*", _Relayed, {"relay": self})])
        server = app.listen(self.port, self._listen)
        self._ready.set()
        await self._stop.wait()
        server.stop()


class _Relayed(RequestHandler):
    """One relayed request (see `Relay`)."""

    SUPPORTED_METHODS = ("GET", "POST")  # type: ignore[assignment]

    def initialize(self, relay: Relay) -> None:
        self.relay = relay

    def check_xsrf_cookie(self) -> None:
        """The console checks its own."""

    async def get(self) -> None:
        headers = HTTPHeaders()
        for name, value in self.request.headers.get_all():
            if name.lower() not in HOP and name not in self.relay.add:
                headers.add(name, value)
        headers.update(self.relay.add)
        answer = await AsyncHTTPClient().fetch(HTTPRequest(
            self.relay.upstream + self.request.uri, method=self.request.method,
            headers=headers, body=self.request.body if self.request.method == "POST" else None,
            follow_redirects=False, network_interface=self.relay.source, request_timeout=30),
            raise_error=False)
        self.set_status(answer.code if answer.code != 599 else 502, answer.reason)
        self.clear_header("Content-Type")
        for name, value in answer.headers.get_all():
            if name.lower() not in HOP:
                self.add_header(name, value)
        if answer.body:
            self.write(answer.body)

    post = get


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if reason := _chromium_missing():
        pytest.skip(reason)
    from examples.seed import seed_cm_data
    tmp = tmp_path_factory.mktemp("console-roles-browser")
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    engine = fresh_database(DATABASES["postgresql"])
    env = console_env(tmp / "console.sqlite", **JOB_ENV, **ROLE_ENV,
                      DATABASE_URL=engine.url.render_as_string(hide_password=False))
    seed_cm_data(engine, ROWS)
    worker = start_worker(env, 2, "console-roles-w1")
    try:
        console, base = start_console(env)
    except BaseException:
        worker.stop()
        raise
    yield Stack(base, engine, env, console, worker, tmp)
    console.stop()
    worker.stop()
    engine.dispose()


@pytest.fixture
def browsers() -> Iterator[list[Any]]:
    """Headless Chromiums for one test (`new()`), each quit after it."""
    made: list[Any] = []
    yield made
    for driver in made:
        driver.quit()


def _new(browsers: list[Any]) -> Any:
    driver = chromium()
    browsers.append(driver)
    return driver


def _shot(driver: Any, stack: Stack, name: str) -> Path:
    path = stack.shots / name
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 5_000
    print(f"screenshot: {path}")
    return path


def _visible_controls(driver: Any) -> set[str]:
    """The job controls a person can see (a hidden one has no layout box)."""
    return set(driver.execute_script(
        "return [...document.querySelectorAll('#controls [data-verb]')]"
        ".filter((e) => e.offsetParent !== null).map((e) => e.dataset.verb)"))


def _controls_become(driver: Any, verbs: set[str], what: str, timeout: float = 30) -> None:
    _wait(driver, lambda d: _visible_controls(d) == verbs, f"{what}: controls {sorted(verbs)} "
          f"(showing {sorted(_visible_controls(driver))})", timeout)


def _log_in_as(driver: Any, base: str, user: str, password: str) -> None:
    driver.get(f"{base}/jobs/cm_data")
    _wait(driver, _present("#password"), "the login form")
    _css(driver, "#user").send_keys(user)
    _css(driver, "#password").send_keys(password)
    _css(driver, "#login").click()
    _wait(driver, _present("#summary .big"), "the job's summary")


def _throttle(driver: Any, rows_per_s: str) -> None:
    field = _css(driver, "#rows-per-s")
    field.clear()
    field.send_keys(rows_per_s)
    _press(driver, "#btn-throttle")


def _post_from_page(driver: Any, path: str) -> int:
    """POST `path` from the page's own script with the page's CSRF token: the status."""
    return int(driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const csrf = document.querySelector('meta[name=\"csrf-token\"]').content;"
        f"fetch('{path}', {{method: 'POST', headers: {{'X-CSRF-Token': csrf}}}})"
        ".then((r) => done(r.status), () => done(0));"))


@pytest.mark.timeout(300)
def test_each_state_shows_only_its_controls_and_a_viewer_sees_none(
    stack: Stack, browsers: list[Any]
) -> None:
    operator = _new(browsers)
    _log_in_as(operator, stack.base, USER, PASSWORD)
    _wait(operator, lambda d: _css(d, "#role").text == "operator", "the operator's role shown")
    _controls_become(operator, {"start"}, "never started")
    assert _css(operator, "#btn-dry-run").is_displayed()
    assert _css(operator, "#schedule-form").is_displayed()
    assert not _css(operator, "#read-only").is_displayed()
    _wait(operator, lambda d: SHOWN_TIME.match(_css(d, "#updated").text),
          "the updated line in UTC")
    _shot(operator, stack, "operator-never-started.png")

    _press(operator, "#btn-start")
    _controls_become(operator, {"pause", "cancel", "throttle"}, "running")
    # Held at 40 rows/s (about 50 s for the job) until the states below have been seen.
    _throttle(operator, "40")
    _wait(operator, _present('#partitions tr[data-state="running"]'), "a running partition")
    _shot(operator, stack, "operator-running.png")

    _press(operator, "#btn-pause")
    _controls_become(operator, {"resume", "cancel", "throttle"}, "paused")
    assert _run_state(stack.engine) == "paused"
    _shot(operator, stack, "operator-paused.png")

    # The run is held by its pause while a viewer looks: no control at all, and its own
    # browser's POST (with its valid CSRF token) is refused with nothing changed.
    viewer = _new(browsers)
    _log_in_as(viewer, stack.base, VIEWER_USER, VIEWER_PASSWORD)
    _wait(viewer, _present("#summary .state-paused"), "the viewer's page showing the pause")
    assert _css(viewer, "#role").text == "viewer"
    assert _visible_controls(viewer) == set()
    assert not _css(viewer, "#schedule-form").is_displayed()
    assert _css(viewer, "#read-only").is_displayed() and _css(viewer, "#logout").is_displayed()
    assert _post_from_page(viewer, "/api/jobs/cm_data/resume") == 403
    assert _post_from_page(viewer, "/api/jobs/cm_data/cancel") == 403
    assert _run_state(stack.engine) == "paused"
    _shot(viewer, stack, "viewer-paused.png")

    _press(operator, "#btn-resume")
    _controls_become(operator, {"pause", "cancel", "throttle"}, "resumed")
    _throttle(operator, "0")  # no cap: let it finish
    wait_until(lambda: _run_state(stack.engine) == "succeeded", 180, "the run to finish")
    _controls_become(operator, {"start"}, "finished")
    _wait(operator, _present('#runs tr[data-state="succeeded"]'), "the finished run's row")
    started = _css(operator, '#runs tr[data-state="succeeded"] td:nth-child(3)').text
    assert SHOWN_TIME.match(started), started
    events = _css(operator, "#runs tbody").text
    assert f"by console:{USER}@127.0.0.1 (operator, password)" in events, events
    _shot(operator, stack, "operator-finished.png")
    assert _visible_controls(viewer) == set()


@pytest.mark.timeout(180)
def test_sso_through_the_trusted_proxy_logs_in_with_the_mapped_role(
    stack: Stack, browsers: list[Any]
) -> None:
    alice = {"X-Forwarded-User": "alice", "X-Forwarded-Groups": "engineering,ops"}
    bob = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "staff"}
    with Relay(stack.base, PROXY, "127.0.0.5", alice) as as_alice, \
            Relay(stack.base, PROXY, "127.0.0.6", bob) as as_bob:
        operator = _new(browsers)
        operator.get(f"{as_alice.base}/jobs/cm_data")
        _wait(operator, _present("#summary .big"), "the job page, without a login form")
        who = _css(operator, "#who").text
        assert "alice" in who and "operator" in who and "via proxy" in who, who
        allowed = operator.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/api/jobs/cm_data').then((r) => r.json()).then((b) => done(b.data.allowed));")
        assert allowed, allowed
        _controls_become(operator, set(allowed), "alice, an operator")
        _shot(operator, stack, "sso-operator.png")

        viewer = _new(browsers)
        viewer.get(f"{as_bob.base}/jobs/cm_data")
        _wait(viewer, _present("#summary .big"), "bob's job page")
        assert "bob" in _css(viewer, "#who").text and _css(viewer, "#role").text == "viewer"
        assert _visible_controls(viewer) == set()
        assert _post_from_page(viewer, "/api/jobs/cm_data/start") == 403
        _shot(viewer, stack, "sso-viewer.png")
    stack.console.wait_for(f"alice signed in through the proxy from {PROXY} as operator")


@pytest.mark.timeout(180)
def test_sso_headers_from_an_untrusted_address_are_ignored(
    stack: Stack, browsers: list[Any]
) -> None:
    alice = {"X-Forwarded-User": "alice", "X-Forwarded-Groups": "ops"}
    # The same relay and headers, connecting from an address the console does not trust.
    with Relay(stack.base, "127.0.0.4", "127.0.0.7", alice) as spoofing:
        driver = _new(browsers)
        driver.get(f"{spoofing.base}/jobs/cm_data")
        _wait(driver, _present("#password"), "the login form (the headers granted nothing)")
        assert driver.current_url.startswith(f"{spoofing.base}/login?next=/jobs/cm_data")
        _shot(driver, stack, "sso-untrusted-login.png")
        driver.get(f"{spoofing.base}/api/jobs")
        assert "log in first" in driver.find_element("tag name", "body").text
        # Through it, only the local login gets in, as the account it names.
        _log_in_as(driver, spoofing.base, VIEWER_USER, VIEWER_PASSWORD)
        assert _css(driver, "#role").text == "viewer" and "via proxy" not in _css(
            driver, "#who").text


@pytest.mark.timeout(120)
def test_an_unknown_job_is_a_small_404_page(stack: Stack, browsers: list[Any]) -> None:
    driver = _new(browsers)
    _log_in_as(driver, stack.base, USER, PASSWORD)
    driver.get(f"{stack.base}/jobs/nosuchjob")
    _wait(driver, _present("#error"), "the 404 page")
    assert _css(driver, "#status").text == "404"
    assert "no range job 'nosuchjob' is registered" in _css(driver, "#error").text
    _shot(driver, stack, "not-found.png")
