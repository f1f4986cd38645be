"""Console roles, proxy-header SSO, per-state controls, 404s and one time zone (issue 22),
over HTTP against a real `python -m tasks console` (no worker: a run stays where its controls
put it). The browser side is tests/test_console_roles_browser.py.

- a viewer (CONSOLE_VIEWER_USER, or a proxy user in a viewer group) reads everything and every
  change it asks is 403 with nothing changed in the database;
- X-Forwarded-User/Groups from a trusted proxy's address log in with the mapped role; the same
  headers from any other address are ignored; a user in no mapped group is 403; another proxy
  user ends the old session; CSRF still applies;
- the job API's `allowed` lists the controls the run's state allows, per state;
- unknown jobs and paths are 404 (a small page, or JSON for the API);
- every time the API writes carries its zone (`tasks.config.clock.iso`).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, select, update

from tasks.console.roles import OPERATOR, VIEWER, allowed, may
from tasks.console.times import zoned
from tasks.ranges.tables import RANGE_RUNS, WORK
from tests import WORKER_REDIS_URL
from tests.support.workers import ROOT, Proc
from tests.test_console_http import (
    CONSOLE,
    PASSWORD,
    USER,
    Answer,
    Browserless,
    console_env,
    start_console,
)

VIEWER_USER = "watcher"
VIEWER_PASSWORD = "viewer-pw-Lk29-never-shown"
PROXY = "127.0.0.3"  # the trusted proxy's address (a client connects from it)
ELSEWHERE = "127.0.0.4"  # any other client
ROLE_ENV = {"CONSOLE_VIEWER_USER": VIEWER_USER, "CONSOLE_VIEWER_PASSWORD": VIEWER_PASSWORD,
            "CONSOLE_SSO": "proxy", "CONSOLE_TRUSTED_PROXIES": PROXY,
            "CONSOLE_OPERATOR_GROUPS": "ops,admins", "CONSOLE_VIEWER_GROUPS": "staff"}
ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def proxy_headers(user: str, groups: str) -> dict[str, str]:
    return {"X-Forwarded-User": user, "X-Forwarded-Groups": groups}


# -- pure rules ------------------------------------------------------------------------------

def _summary(state: str, run: int | None = 1, failed: int = 0, skipped: int = 0) -> dict[str, Any]:
    return {"state": state, "run": run, "partitions": {"failed": failed} if failed else {},
            "rows_skipped": skipped}


@pytest.mark.parametrize(("summary", "verbs"), [
    (_summary("never started", run=None), ["start"]),
    (_summary("running"), ["pause", "cancel", "throttle"]),
    (_summary("paused"), ["resume", "cancel", "throttle"]),
    (_summary("following"), ["cancel", "throttle"]),
    (_summary("succeeded"), ["start"]),
    (_summary("cancelled"), ["start"]),
    (_summary("failed", failed=2), ["start", "retry-failed"]),
    (_summary("running", failed=1), ["pause", "cancel", "retry-failed", "throttle"]),
    (_summary("paused", skipped=3), ["resume", "cancel", "retry-skipped", "throttle"]),
    (_summary("succeeded", skipped=3), ["start", "retry-skipped"]),
    (_summary("cancelled", failed=1), ["start"]),  # retry-failed needs a live or failed run
    # Partitions but no recorded run (before run history): only a start.
    (_summary("running", run=None, failed=1, skipped=2), ["start"]),
])
def test_the_controls_each_state_allows_an_operator(summary: dict[str, Any],
                                                    verbs: list[str]) -> None:
    assert allowed(summary, OPERATOR) == verbs
    assert allowed(summary, VIEWER) == []
    assert allowed(summary, None) == [] and allowed(summary, "admin") == []


def test_roles_are_ordered() -> None:
    assert may(OPERATOR, VIEWER) and may(OPERATOR, OPERATOR) and may(VIEWER, VIEWER)
    assert not may(VIEWER, OPERATOR) and not may("", VIEWER) and not may(None, VIEWER)


def test_every_time_the_api_writes_names_its_zone() -> None:
    data = {"job": {"state": "running"}, "runs": [
        {"started_at": "2026-12-07T04:47:39Z", "finished_at": None,
         "events": [{"at": "2026-12-07T04:47:39.123456", "verb": "start"}]}],
        "partitions": [{"heartbeat_at": "2026-12-07T04:47:39+01:00", "throttled_until": None,
                        "owner": "w@h"}],
        "schedule": {"next_due": "2026-12-08T02:00:00", "cron": "0 2 * * *"},
        "letters": [{"created_at": "2026-12-07 04:47:39", "reason": "at noon"}],
        "not_a_time_at": "soon"}
    out = zoned(data)
    assert out["runs"][0]["started_at"] == "2026-12-07T04:47:39Z"
    assert out["runs"][0]["finished_at"] is None
    assert out["runs"][0]["events"][0] == {"at": "2026-12-07T04:47:39Z", "verb": "start"}
    assert out["partitions"][0]["heartbeat_at"] == "2026-12-07T03:47:39Z"  # +01:00 -> UTC
    assert out["schedule"]["next_due"] == "2026-12-08T02:00:00Z"
    assert out["letters"][0] == {"created_at": "2026-12-07T04:47:39Z", "reason": "at noon"}
    assert out["not_a_time_at"] == "soon" and out["job"] == {"state": "running"}


# -- refusals at start -----------------------------------------------------------------------

def _refused(env: dict[str, str]) -> str:
    done = subprocess.run(CONSOLE, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode in (1, 2), done.stdout[-500:] + done.stderr[-2000:]  # 2: settings
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize(("overrides", "says"), [
    ({"CONSOLE_TRUSTED_PROXIES": ""}, "CONSOLE_SSO=proxy needs CONSOLE_TRUSTED_PROXIES"),
    ({"CONSOLE_OPERATOR_GROUPS": "", "CONSOLE_VIEWER_GROUPS": ""},
     "CONSOLE_SSO=proxy needs CONSOLE_OPERATOR_GROUPS or CONSOLE_VIEWER_GROUPS"),
    ({"CONSOLE_VIEWER_PASSWORD": ""}, "CONSOLE_VIEWER_USER and CONSOLE_VIEWER_PASSWORD are set "
                                      "together"),
    ({"CONSOLE_VIEWER_PASSWORD": "short-pw"},
     "CONSOLE_VIEWER_PASSWORD must be at least 12 characters"),
    ({"CONSOLE_VIEWER_PASSWORD": "change-me"}, "CONSOLE_VIEWER_PASSWORD is a value shipped"),
    ({"CONSOLE_VIEWER_USER": USER}, "CONSOLE_VIEWER_USER must differ from CONSOLE_USER"),
    ({"CONSOLE_SSO": "header"}, "CONSOLE_SSO='header' must be one of off, proxy"),
])
def test_the_console_refuses_to_start_with_sso_or_a_viewer_it_cannot_trust(
    tmp_path: Path, overrides: dict[str, str], says: str
) -> None:
    env = console_env(tmp_path / "c.sqlite", **{**ROLE_ENV, **overrides})
    line = _refused({k: v for k, v in env.items() if v != ""})
    assert says in line, line
    assert VIEWER_PASSWORD not in line and PASSWORD not in line


# -- a console with a viewer and proxy SSO ---------------------------------------------------

@dataclass
class Console:
    proc: Proc
    base: str
    engine: Engine


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    from examples.seed import seed_cm_data
    from examples.tables import migrate
    from tasks.store.resources import make_engine

    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    db = tmp_path_factory.mktemp("console-roles") / "console.sqlite"
    env = console_env(db, **ROLE_ENV)
    engine = make_engine(f"sqlite:///{db}")
    migrate(engine)
    seed_cm_data(engine, 60)
    proc, base = start_console(env)
    yield Console(proc, base, engine)
    proc.stop()
    engine.dispose()


def _logged_in(base: str, user: str = USER, password: str = PASSWORD) -> Browserless:
    client = Browserless(base)
    assert client.login(user, password).status == 302
    return client


def _token(client: Browserless, headers: dict[str, str] | None = None) -> dict[str, str]:
    page = client.request("/jobs", headers=headers)
    found = re.search(r'name="csrf-token" content="([^"]+)"', page.body)
    assert found, (page.status, page.body[:300])
    return {**(headers or {}), "X-CSRF-Token": found.group(1)}


def _runs(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [(r.id, r.state) for r in conn.execute(
            select(RANGE_RUNS.c.id, RANGE_RUNS.c.state).where(RANGE_RUNS.c.job == "cm_data")
            .order_by(RANGE_RUNS.c.id))]


def _detail(client: Browserless, headers: dict[str, str] | None = None) -> dict[str, Any]:
    answer = client.request("/api/jobs/cm_data", headers=headers)
    assert answer.status == 200, (answer.status, answer.body[:300])
    return answer.json()["data"]  # type: ignore[no-any-return]


def _post(client: Browserless, path: str, headers: dict[str, str],
          data: dict[str, str] | None = None) -> Answer:
    return client.request(path, data or {}, headers)


def test_a_viewer_reads_everything_and_changes_nothing(console: Console) -> None:
    from sqlalchemy.orm import sessionmaker

    from tasks.deadletters.store import DeadLetters

    viewer = _logged_in(console.base, VIEWER_USER, VIEWER_PASSWORD)
    page = viewer.request("/jobs/cm_data")
    assert page.status == 200 and 'data-role="viewer"' in page.body
    assert f"{VIEWER_USER} · " in page.body and ">viewer</span>" in page.body
    for path in ("/api/jobs", "/api/jobs/cm_data", "/api/restock", "/api/deadletters",
                 "/api/queues", "/jobs", "/restock", "/deadletters", "/queues"):
        assert viewer.request(path).status == 200, path
    assert _detail(viewer)["allowed"] == []
    token = _token(viewer)
    letters = DeadLetters(sessionmaker(console.engine))
    letters.add("task", "t-viewer", "boom", {"task": "devtools.samples.nap", "args": [0.1],
                                              "kwargs": {}})
    before = _runs(console.engine), letters.counts()
    # The console's own controls and the pages' (tasks/console/pages.py: bulk, upload) alike.
    for path, data in (("/api/jobs/cm_data/start", {}), ("/api/jobs/cm_data/pause", {}),
                       ("/api/jobs/cm_data/throttle", {"rows_per_s": "5"}),
                       ("/api/jobs/cm_data/schedule", {"cron": "0 2 * * *"}),
                       ("/api/deadletters/purge", {"older_than": "1s"}),
                       ("/api/deadletters/1/replay", {}),
                       ("/api/deadletters/bulk", {"action": "purge", "expected": "1",
                                                  "upto": "999999"}),
                       ("/api/jobs/cm_data/upload", {})):
        refused = _post(viewer, path, token, data)
        assert refused.status == 403, (path, refused.status, refused.body)
        assert "has the role viewer, which changes nothing" in refused.json()["error"], path
    assert (_runs(console.engine), letters.counts()) == before
    assert _detail(viewer)["schedule"] is None
    # Reading is all it may do: a dry run (reads only) and its own logout.
    assert _post(viewer, "/api/jobs/cm_data/dry-run", token).status == 200
    assert viewer.request("/logout", {"_csrf": token["X-CSRF-Token"]}).status == 302
    assert viewer.request("/api/jobs").status == 401


def test_the_job_api_allows_the_controls_of_the_run_state(console: Console) -> None:
    operator = _logged_in(console.base)
    viewer = _logged_in(console.base, VIEWER_USER, VIEWER_PASSWORD)
    token = _token(operator)
    detail = _detail(operator)
    if detail["job"]["run"] is None:
        assert detail["allowed"] == ["start"]
        assert _post(operator, "/api/jobs/cm_data/start", token).status == 200
    assert _detail(operator)["allowed"] == ["pause", "cancel", "throttle"]
    assert _detail(viewer)["allowed"] == []
    assert _post(operator, "/api/jobs/cm_data/pause", token).status == 200
    assert _runs(console.engine)[-1][1] == "paused"
    assert _detail(operator)["allowed"] == ["resume", "cancel", "throttle"]
    # A failed partition (set by hand: no worker runs here) brings retry-failed.
    with console.engine.begin() as conn:
        conn.execute(update(WORK).where(WORK.c.job == "cm_data", WORK.c.part == 0)
                     .values(status="failed", error="boom"))
    assert _detail(operator)["allowed"] == ["resume", "cancel", "retry-failed", "throttle"]
    assert _post(operator, "/api/jobs/cm_data/retry-failed", token).status == 200
    assert _post(operator, "/api/jobs/cm_data/resume", token).status == 200
    assert _detail(operator)["allowed"] == ["pause", "cancel", "throttle"]
    assert _post(operator, "/api/jobs/cm_data/cancel", token).status == 200
    assert _detail(operator)["allowed"] == ["start"]
    events = [e for run in _detail(operator)["runs"] for e in run["events"]]
    assert events and all(ISO_Z.match(e["at"]) for e in events), events
    assert f"console:{USER}@127.0.0.1 (operator, password)" in {e["actor"] for e in events}


def test_sso_from_the_trusted_proxy_logs_in_with_the_mapped_role(console: Console) -> None:
    alice = Browserless(console.base, source=PROXY)
    as_alice = proxy_headers("alice", "engineering, ops")
    page = alice.request("/jobs/cm_data", headers=as_alice)
    assert page.status == 200, (page.status, page.headers.get("Location"))
    assert 'data-role="operator"' in page.body and "alice · " in page.body
    assert "via proxy" in page.body
    token = _token(alice, as_alice)
    # The login form sends a proxy user on to the page asked for.
    login = alice.request("/login?next=/restock", headers=as_alice)
    assert login.status == 302 and login.headers["Location"] == "/restock"
    # CSRF still applies to a proxy user.
    assert _post(alice, "/api/jobs/cm_data/throttle", as_alice, {"rows_per_s": "9"}
                 ).status == 403
    if _detail(alice, as_alice)["allowed"] == ["start"]:
        assert _post(alice, "/api/jobs/cm_data/start", token).status == 200
    assert _post(alice, "/api/jobs/cm_data/throttle", token, {"rows_per_s": "9"}).status == 200
    actors = {e["actor"] for run in _detail(alice, as_alice)["runs"] for e in run["events"]}
    assert f"console:alice@{PROXY} (operator, proxy)" in actors, actors
    console.proc.wait_for(f"alice signed in through the proxy from {PROXY} as operator")

    bob = Browserless(console.base, source=PROXY)
    as_bob = proxy_headers("bob", "staff")
    assert 'data-role="viewer"' in bob.request("/jobs", headers=as_bob).body
    assert _detail(bob, as_bob)["allowed"] == []
    refused = _post(bob, "/api/jobs/cm_data/pause", _token(bob, as_bob))
    assert refused.status == 403 and "role viewer" in refused.json()["error"]


def test_the_proxy_headers_from_any_other_address_are_ignored(console: Console) -> None:
    spoofer = Browserless(console.base, source=ELSEWHERE)
    as_alice = proxy_headers("alice", "ops")
    page = spoofer.request("/jobs/cm_data", headers=as_alice)
    assert page.status == 302 and page.headers["Location"].startswith("/login")
    assert spoofer.request("/api/jobs", headers=as_alice).status == 401
    assert spoofer.request("/login?next=/restock", headers=as_alice).status == 200
    assert _post(spoofer, "/api/jobs/cm_data/pause", {**as_alice, "X-CSRF-Token": "x"}
                 ).status == 401
    # A session opened through the proxy is nothing without it: a copy of its cookie sent
    # from elsewhere (headers and all) is refused, and so is the original then.
    alice = Browserless(console.base, source=PROXY)
    assert alice.request("/api/jobs", headers=as_alice).status == 200
    thief = Browserless(console.base, source=ELSEWHERE)
    for cookie in alice.jar:
        thief.jar.set_cookie(cookie)
    assert thief.request("/api/jobs", headers=as_alice).status == 401
    # The local login still works from there, as the account it names.
    local = Browserless(console.base, source=ELSEWHERE)
    assert local.login(headers=as_alice).status == 302
    assert 'data-role="operator"' in local.request("/jobs", headers=as_alice).body
    assert f"{USER} · " in local.request("/jobs").body


def test_a_proxy_user_in_no_mapped_group_is_refused(console: Console) -> None:
    carol = Browserless(console.base, source=PROXY)
    for groups in ("", "interns, guests"):
        headers = proxy_headers("carol", groups)
        page = carol.request("/jobs", headers=headers)
        assert page.status == 403, page.status
        assert "user &#x27;carol&#x27; is in no group this console maps to a role" in page.body
        assert "<html" in page.body and "Traceback" not in page.body
        api = carol.request("/api/jobs", headers=headers)
        assert api.status == 403 and "is in no group" in api.json()["error"]
    bad = carol.request("/api/jobs", headers=proxy_headers("carol\tadmin", "ops"))
    assert bad.status == 400 and "X-Forwarded-User" in bad.json()["error"]


def test_another_proxy_user_does_not_inherit_the_session(console: Console) -> None:
    browser = Browserless(console.base, source=PROXY)
    as_alice, as_bob = proxy_headers("alice", "ops"), proxy_headers("bob", "staff")
    alice_token = _token(browser, as_alice)
    stolen = Browserless(console.base, source=PROXY)
    for cookie in browser.jar:
        stolen.jar.set_cookie(cookie)
    # The proxy now names bob on the same browser: bob's own session, bob's role ...
    page = browser.request("/jobs", headers=as_bob)
    assert 'data-role="viewer"' in page.body and "bob · " in page.body
    # ... and alice's session is over: her cookie and token get nothing as bob ...
    refused = _post(stolen, "/api/jobs/cm_data/pause", {**alice_token, **as_bob})
    assert refused.status == 403 and "CSRF" in refused.json()["error"]
    # ... nor as alice: the proxy opens her a new session, with a new token.
    assert _post(stolen, "/api/jobs/cm_data/pause", alice_token).status == 403
    assert _token(stolen, as_alice)["X-CSRF-Token"] != alice_token["X-CSRF-Token"]
    # The same user in other groups has another role: a new session too.
    demoted = proxy_headers("alice", "staff")
    assert 'data-role="viewer"' in stolen.request("/jobs", headers=demoted).body


def test_unknown_jobs_and_paths_are_404(console: Console) -> None:
    operator = _logged_in(console.base)
    token = _token(operator)
    for path in ("/jobs/nosuchjob", "/nosuch", "/jobs/cm_data/extra", "/login/x"):
        page = operator.request(path)
        assert page.status == 404, (path, page.status)
        assert "<html" in page.body and len(page.body) < 2000, path
        assert "404" in page.body and "Traceback" not in page.body, path
    assert "no range job &#x27;nosuchjob&#x27; is registered" in operator.request(
        "/jobs/nosuchjob").body
    for path in ("/api/jobs/nosuchjob", "/api/nosuch"):
        answer = operator.request(path)
        assert answer.status == 404 and answer.json()["status"] == 404, path
    missing = _post(operator, "/api/jobs/nosuchjob/pause", token)
    assert missing.status == 404 and "nosuchjob" in missing.json()["error"]
    # Without a session an unknown path is still 404 (it names nothing to protect).
    assert Browserless(console.base).request("/nosuch").status == 404


def test_api_times_carry_their_zone(console: Console) -> None:
    from sqlalchemy.orm import sessionmaker

    from tasks.deadletters.store import DeadLetters

    DeadLetters(sessionmaker(console.engine)).add("task", "t-z", "boom", {
        "task": "devtools.samples.nap", "args": [0.1], "kwargs": {}})
    operator = _logged_in(console.base)
    letters = operator.request("/api/deadletters").json()["data"]["letters"]
    assert letters and all(ISO_Z.match(s["created_at"]) for s in letters), letters
    shown = operator.request(f"/api/deadletters/{letters[0]['id']}").json()["data"]
    assert ISO_Z.match(shown["created_at"]), shown
    token = _token(operator)
    if _detail(operator)["allowed"] == ["start"]:
        assert _post(operator, "/api/jobs/cm_data/start", token).status == 200
    runs = _detail(operator)["runs"]
    assert runs and all(ISO_Z.match(r["started_at"]) for r in runs), runs
    assert _post(operator, "/api/jobs/cm_data/schedule", token, {"cron": "0 2 * * *"}
                 ).status == 200
    assert ISO_Z.match(_detail(operator)["schedule"]["next_due"])
