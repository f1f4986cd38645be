"""`python -m tasks status` and the console's job API at 10,000 partitions (issue 20), as an
operator runs them: `status --json` stays small (the jobs' totals per state and one page),
its paging flags and filters hold, and a bad flag is one line and exit 1; the console's
`/api/jobs/<job>` answers the same pages from its query string (400 for a bad one) and the job
page is a shell with filter links, never a row per partition."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.support import forkcli
from tests.support.planted import owner_of, plant, state_of
from tests.support.workers import ROOT, Proc
from tests.test_console_http import Browserless, console_env, start_console

JOB = "cm_data"  # registered on the console (EXTRA_TASK_MODULES: bench.cm_data)
COUNT = 10_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], str]]:
    """A SQLite database holding 10,000 partitions of JOB, the environment of a CLI on it and
    a console serving it (logged in by each test)."""
    import redis

    from tests import WORKER_REDIS_URL
    from tests.support.db import fresh_database

    db = tmp_path_factory.mktemp("scale") / "scale.sqlite"
    engine = fresh_database(f"sqlite:///{db}")
    plant(engine, JOB, COUNT)
    engine.dispose()
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    env = console_env(db)
    proc: Proc
    proc, base = start_console(env)
    try:
        yield env, base
    finally:
        proc.stop()


def status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "tasks", "status", *args], env, ROOT, 120)


def status_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    run = status(env, "--json", *args)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(run.stdout)
    assert (data["version"], data["kind"]) == (1, "status")
    return data["item"]  # type: ignore[no-any-return]


def test_status_json_holds_the_totals_and_one_small_page(
    stack: tuple[dict[str, str], str]
) -> None:
    env, _ = stack
    started = time.monotonic()
    run = status(env, "--json")
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-2000:]
    print(f"status --json at {COUNT:,} partitions: {len(run.stdout):,} bytes, {took:.2f} s")
    assert len(run.stdout.encode()) < 100_000
    data = json.loads(run.stdout)["item"]
    [job] = data["jobs"]
    assert job["partitions"] == {"done": 6000, "failed": 1000, "paused": 1000,
                                 "pending": 1000, "running": 1000}
    assert job["states"]["running"]["partitions"] == 1000
    assert job["states"]["done"]["rows_done"] == 6000 * 100
    assert len(data["partitions"]) == 50 and data["partitions"][0]["part"] == 0
    page = data["page"]
    assert (page["total"], page["shown"], page["limit"]) == (COUNT, 50, 50)
    assert (page["next"], page["prev"]) == (f"{JOB}:49", None)
    assert {"restock_nodes", "dead_letters"} <= data.keys()


def test_status_flags_page_and_filter(stack: tuple[dict[str, str], str]) -> None:
    """The flags reach the view (whose walk over every page is tests/ranges/
    test_status_paging.py's; the console's walk below goes through the same view): the first
    page, the last, and the filters."""
    env, _ = stack
    first = status_json(env, "--limit", "500", "--after", "")
    assert [p["part"] for p in first["partitions"]] == list(range(500))
    assert first["page"]["next"] == f"{JOB}:499" and first["page"]["prev"] is None
    last = status_json(env, "--limit", "500", "--after", f"{JOB}:9499")
    assert [p["part"] for p in last["partitions"]] == list(range(9500, COUNT))
    assert last["page"]["next"] is None and last["page"]["prev"] == f"{JOB}:8999"
    failed = status_json(env, "--state", "failed", "--limit", "20", "--after", f"{JOB}:5000")
    assert [p["part"] for p in failed["partitions"]] == [p for p in range(5001, 5200)
                                                         if state_of(p) == "failed"]
    assert failed["page"]["total"] == 1000 and failed["page"]["prev"] == f"{JOB}:4798"
    mine = status_json(env, "--owner", "w2@host:1003", "--limit", "500")
    assert [p["part"] for p in mine["partitions"]] == [
        p for p in range(COUNT) if owner_of(p) == "w2@host:1003"]
    slow = status_json(env, "--slowest", "--limit", "5")
    rates = [p["rows_per_s"] for p in slow["partitions"]]
    assert rates == sorted(rates) and {p["status"] for p in slow["partitions"]} == {"running"}
    assert slow["page"]["next"] == "5" and slow["page"]["total"] == 1000


def test_the_table_names_the_page_and_the_next(stack: tuple[dict[str, str], str]) -> None:
    env, _ = stack
    run = status(dict(env, COLUMNS="200"), "--state", "failed", "--limit", "3")
    assert run.returncode == 0, run.stderr
    assert "3 of 1,000 partitions (state failed); next page: --after cm_data:28" in run.stdout
    assert run.stdout.count("failed: ValueError: a bad row") == 3
    none = status(env, "--owner", "nobody")
    assert none.returncode == 0 and "no partition matches (owner nobody*)" in none.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["--limit", "0"], "status: limit must be from 1 to 500, not 0"),
    (["--limit", "5000"], "status: limit must be from 1 to 500, not 5000"),
    (["--after", "garbage"], "the cursor is JOB:PART"),
    (["--state", "sleeping"], "unknown partition state 'sleeping'"),
    (["--slowest", "--after", "cm_data:4"], "with slowest the cursor is the number"),
])
def test_a_bad_paging_flag_is_one_line_and_exit_1(
    stack: tuple[dict[str, str], str], args: list[str], says: str
) -> None:
    env, _ = stack
    for extra in ([], ["--json"]):
        run = status(env, *args, *extra)
        assert run.returncode == 1 and run.stdout == ""
        [line] = run.stderr.splitlines()
        assert says in line, line
        if extra:  # under --json the refusal is an error envelope too
            assert json.loads(line) == {"version": 1, "kind": "error", "item": {
                "message": json.loads(line)["item"]["message"], "exit_code": 1}}


def _api(operator: Browserless, **params: Any) -> tuple[int, Any]:
    answer = operator.request(f"/api/jobs/{JOB}?{urlencode(params, doseq=True)}")
    return answer.status, answer.json()


def test_the_console_job_api_walks_every_partition_once_and_filters(
    stack: tuple[dict[str, str], str]
) -> None:
    _, base = stack
    operator = Browserless(base)
    assert operator.login().status == 302
    started = time.monotonic()
    code, body = _api(operator)
    print(f"/api/jobs/{JOB} at {COUNT:,} partitions: {time.monotonic() - started:.3f} s")
    assert code == 200, body
    data = body["data"]
    assert data["job"]["partitions"]["running"] == 1000
    assert data["job"]["states"]["failed"]["rows_done"] == 1000 * 10
    assert len(data["partitions"]) == 50 and data["page"]["total"] == COUNT
    seen: list[int] = []
    after = ""
    while True:
        code, body = _api(operator, limit=500, after=after)
        assert code == 200 and len(body["data"]["partitions"]) <= 500
        seen += [p["part"] for p in body["data"]["partitions"]]
        after = body["data"]["page"]["next"]
        if after is None:
            break
    assert seen == list(range(COUNT))
    code, body = _api(operator, state=["pending", "paused"], limit=500)
    page = body["data"]
    assert page["page"]["total"] == 2000 and page["page"]["next"] == f"{JOB}:2499"
    assert {p["status"] for p in page["partitions"]} == {"pending", "paused"}
    code, body = _api(operator, slowest=1, owner="w0@", limit=500)
    running = body["data"]["partitions"]
    assert {p["owner"][:3] for p in running} == {"w0@"} and len(running) == 334
    assert [p["rows_per_s"] for p in running] == sorted(p["rows_per_s"] for p in running)


@pytest.mark.parametrize("params", [
    {"limit": "0"}, {"limit": "x"}, {"limit": "501"}, {"after": "nope"}, {"state": "bogus"},
    {"slowest": "1", "after": "cm_data:3"}, {"slowest": "maybe"},
])
def test_a_bad_page_is_400_with_the_reason(stack: tuple[dict[str, str], str],
                                           params: dict[str, str]) -> None:
    _, base = stack
    operator = Browserless(base)
    assert operator.login().status == 302
    code, body = _api(operator, **params)
    assert code == 400 and body["status"] == 400, body
    assert body["error"] and "\n" not in body["error"]
    assert Browserless(base).request(f"/api/jobs/{JOB}?limit=0").status == 401  # auth first


def test_the_job_page_is_a_shell_with_filter_links(stack: tuple[dict[str, str], str]) -> None:
    _, base = stack
    operator = Browserless(base)
    assert operator.login().status == 302
    page = operator.request(f"/jobs/{JOB}?state=failed")
    assert page.status == 200
    for link in (f'href="/jobs/{JOB}"', f'href="/jobs/{JOB}?state=running"',
                 f'href="/jobs/{JOB}?slowest=1"'):
        assert link in page.body, link
    current = re.findall(r'data-filter="(\w+)"\s+href="[^"]*"\s+aria-current="page"', page.body)
    assert current == ["failed"]
    assert 'id="next"' in page.body and 'id="prev"' in page.body
    assert len(page.body) < 20_000  # the rows come from the API, a page at a time
