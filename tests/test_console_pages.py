"""The console's run page, queue view, dead-letter search with bulk replay and purge, and CSV
upload (issues 21 and 22), over HTTP against a real `python -m tasks console` on SQLite; the
search and the bulk actions also in-process on PostgreSQL and MariaDB (their LIKE and their
SQL differ). No worker runs: what a run page shows is written with the platform's own
functions, and queued messages wait in the broker where the test put them."""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletters.bulk import (
    BadFilter,
    FilterChanged,
    LetterFilter,
    escape_like,
    preview,
    purge_matching,
    replay_matching,
)
from tasks.deadletters.store import DeadLetters
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.ranges.tables import RANGE_RUNS, RUN_INPUT
from tasks.store.resources import make_engine
from tests import SAMPLE_MODULES, WORKER_REDIS_URL
from tests.support.db import DATABASES, fresh_database
from tests.support.workers import Proc
from tests.test_console_http import Answer, Browserless, console_env, start_console

pytestmark = pytest.mark.timeout(120)

MODULES = f"{SAMPLE_MODULES},tests.support.visit_jobs"
TRACE = ('Traceback (most recent call last):\n  File "job.py", line 7, in process\n'
         '    raise ValueError("boom")\nValueError: boom')


@dataclass
class Console:
    proc: Proc
    base: str
    sessions: sessionmaker[Session]
    engine: Engine


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    db = tmp_path_factory.mktemp("console-pages") / "console.sqlite"
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    env = console_env(db, EXTRA_TASK_MODULES=MODULES)
    proc, base = start_console(env)
    engine = make_engine(f"sqlite:///{db}")
    yield Console(proc, base, sessionmaker(engine), engine)
    proc.stop()
    engine.dispose()


@pytest.fixture
def operator(console: Console) -> Browserless:
    client = Browserless(console.base)
    assert client.login().status == 302
    return client


def _token(client: Browserless) -> dict[str, str]:
    return {"X-CSRF-Token": client.csrf()}


def _data(answer: Answer) -> Any:
    assert answer.status == 200, (answer.status, answer.body[:500])
    return answer.json()["data"]


# -- the run page ----------------------------------------------------------------------------

def _a_run_with_a_failure(sessions: sessionmaker[Session]) -> int:
    """Run 1 of cm_data as a worker would leave it: started, paused and resumed by an
    operator, a failed partition with its traceback, a row skipped (its letter)."""
    from tasks.ranges.failures import record_failure
    from tasks.ranges.runs import open_run, record, writing

    with writing(sessions) as session:
        run_id, number = open_run(session, "cm_data", None, "console:ann@10.0.0.5", None,
                                  json.dumps({"tenant": 7}))
        record(session, run_id, "cm_data", "pause", "console:bob@10.0.0.6")
        record(session, run_id, "cm_data", "resume", "console:bob@10.0.0.6")
        record_failure(session, "cm_data", 3, "w1@host:42", "ValueError: boom", TRACE)
    DeadLetters(sessions).add("range-skip", "cm_data:2:4242", "KeyError: 'sku'", {
        "job": "cm_data", "part": 2, "row_id": 4242, "reason": "KeyError: 'sku'",
        "fence": 1, "run": run_id})
    return number


def test_the_run_page_shows_who_did_what_and_a_failed_partitions_traceback(
        console: Console, operator: Browserless) -> None:
    number = _a_run_with_a_failure(console.sessions)
    run = _data(operator.request(f"/api/jobs/cm_data/runs/{number}"))
    assert (run["run"], run["job"], run["state"]) == (number, "cm_data", "running")
    assert run["started_by"] == "console:ann@10.0.0.5" and run["params"] == {"tenant": 7}
    assert run["started_at"].endswith("Z") and run["started"].endswith(" UTC")
    assert run["finished"] == "-" and run["duration"]
    assert [(e["verb"], e["actor"]) for e in run["events"]] == [
        ("start", "console:ann@10.0.0.5"), ("pause", "console:bob@10.0.0.6"),
        ("resume", "console:bob@10.0.0.6"), ("partition-failed", "w1@host:42")]
    assert all(e["shown"].endswith(" UTC") for e in run["events"])
    [failure] = run["failures"]
    assert (failure["part"], failure["error"], failure["by"]) == (3, "ValueError: boom",
                                                                   "w1@host:42")
    assert failure["traceback"] == TRACE
    [skipped] = run["skipped_rows"]
    assert (skipped["row_id"], skipped["reason"]) == (4242, "KeyError: 'sku'")
    page = operator.request(f"/jobs/cm_data/runs/{number}")
    assert page.status == 200 and "run.js" in page.body and 'data-run="1"' in page.body
    runs = _data(operator.request("/api/jobs/cm_data/runs"))
    assert [r["run"] for r in runs["runs"]] == [number] and runs["csv"] is False
    listed = operator.request("/jobs/cm_data/runs")
    assert listed.status == 200 and "upload-link" not in listed.body


@pytest.mark.parametrize("path", ["/jobs/cm_data/runs/99", "/jobs/no_such_job/runs/1",
                                  "/jobs/no_such_job/runs", "/jobs/no_such_job/upload",
                                  "/jobs/cm_data/upload", "/api/jobs/cm_data/runs/99",
                                  "/api/jobs/no_such_job/runs/1", "/api/jobs/no_such_job/runs"])
def test_an_unknown_job_or_run_is_404(operator: Browserless, path: str) -> None:
    answer = operator.request(path)
    assert answer.status == 404, (path, answer.status, answer.body[:300])
    if path.startswith("/api/"):
        assert "no run 99" in answer.json()["error"] or "no_such_job" in answer.json()["error"]


# -- the queue view --------------------------------------------------------------------------

def test_the_queue_view_counts_what_waits_in_a_queue(console: Console,
                                                     operator: Browserless) -> None:
    from tasks.celery import app, settings
    from tasks.worker.backlog import queue_backlog

    queue = settings.default_queue
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.delete(queue)
    for n in range(5):  # no worker consumes them: they wait
        app.send_task("devtools.samples.nap", args=[0.01 * n], queue=queue)
    try:
        shown = {q["name"]: q for q in _data(operator.request("/api/queues"))}
        assert shown[queue]["messages"] == 5 and shown[queue]["oldest_s"] is not None
        assert settings.control_queue in shown
        [direct] = queue_backlog(app, [queue])
        assert direct.messages == 5
        page = operator.request("/queues")
        assert page.status == 200 and "queues.js" in page.body
    finally:
        client.delete(queue)
        client.close()
    shown = {q["name"]: q for q in _data(operator.request("/api/queues"))}
    assert shown[queue]["messages"] == 0 and shown[queue]["oldest_s"] is None


# -- dead letters: search and bulk -----------------------------------------------------------

def _letters(sessions: sessionmaker[Session], tag: str) -> dict[str, int]:
    """Letters whose refs carry `tag`, by what each tests; their ids."""
    store = DeadLetters(sessions)
    nap = {"task": "devtools.samples.nap", "args": [0.01], "kwargs": {}}
    made = {"pct": (f"{tag}-50%_off", "Boom"), "near": (f"{tag}-50xyoff", "boom"),
            "under": (f"{tag}-a_b", "fine"), "x": (f"{tag}-axb", "FINE"),
            "quiet": (f"{tag}-quiet", "nothing to see")}
    ids = {}
    for name, (ref, reason) in made.items():
        store.add("task", ref, reason, nap)
        ids[name] = store.recent(1)[0].id
    return ids


@pytest.mark.parametrize(("search", "found"), [
    ("50%_", {"pct"}), ("50", {"pct", "near"}), ("a_b", {"under"}), ("_", {"pct", "under"}),
    ("BOOM", {"pct", "near"}), ("fine", {"under", "x"}), ("%", {"pct"}), ("", None)])
def test_search_matches_ref_and_reason_literally_and_case_insensitively(
        console: Console, operator: Browserless, search: str, found: set[str] | None) -> None:
    tag = uuid.uuid4().hex[:8]
    ids = _letters(console.sessions, tag)
    data = _data(operator.request(f"/api/deadletters/search?kind=task&search={tag}-"))
    assert {s["id"] for s in data["letters"]} == set(ids.values())
    got = _data(operator.request(
        "/api/deadletters/search?" + _query(kind="task", search=search)))
    mine = {name for name, i in ids.items() if i in {s["id"] for s in got["letters"]}}
    assert mine == (found if found is not None else set(ids))
    assert got["matching"]["count"] >= len(mine)


def _query(**fields: str) -> str:
    from urllib.parse import urlencode

    return urlencode(fields)


def test_escape_like_escapes_wildcards_and_its_escape() -> None:
    assert escape_like("50%_off!") == "50!%!_off!!"
    assert escape_like("plain") == "plain"
    with pytest.raises(BadFilter, match="at most 200"):
        LetterFilter(None, "x" * 201)


def test_a_search_too_long_is_refused(operator: Browserless) -> None:
    for path in ("/api/deadletters/search?", "/api/deadletters/bulk?"):
        answer = operator.request(path + _query(search="x" * 201))
        assert answer.status == 409 and "at most 200" in answer.json()["error"], path


def test_bulk_purge_takes_what_was_confirmed_and_nothing_else(
        console: Console, operator: Browserless) -> None:
    tag = uuid.uuid4().hex[:8]
    ids = _letters(console.sessions, tag)
    token = _token(operator)
    shown = _data(operator.request("/api/deadletters/bulk?" + _query(kind="task",
                                                                      search=f"{tag}-50")))
    assert (shown["count"], shown["upto"]) == (2, ids["near"])
    assert shown["described"] == f"letters of kind task matching '{tag}-50'"
    fields = {"action": "purge", "kind": "task", "search": f"{tag}-50",
              "upto": str(shown["upto"])}
    # A count that is not the one the filter matches is refused; nothing is deleted.
    wrong = operator.request("/api/deadletters/bulk", {**fields, "expected": "3"}, token)
    assert wrong.status == 409 and "3 letters of kind task" in wrong.json()["error"]
    assert operator.request("/api/deadletters/bulk", {**fields, "action": "nuke",
                                                      "expected": "2"}, token).status == 409
    assert operator.request("/api/deadletters/bulk", {**fields, "expected": "2"}).status == 403
    # A letter that matches but came after the confirmation is not touched.
    DeadLetters(console.sessions).add("task", f"{tag}-50-late", "late", {})
    done = _data(operator.request("/api/deadletters/bulk", {**fields, "expected": "2"}, token))
    assert (done["matched"], done["done"], done["gone"]) == (2, 2, 0)
    with console.engine.connect() as conn:
        left = set(conn.execute(select(DEAD_LETTERS.c.ref).where(
            DEAD_LETTERS.c.ref.startswith(tag))).scalars())
    assert left == {f"{tag}-a_b", f"{tag}-axb", f"{tag}-quiet", f"{tag}-50-late"}


def test_bulk_replay_replays_each_letter_once_and_says_what_it_skipped(
        console: Console, operator: Browserless) -> None:
    tag = uuid.uuid4().hex[:8]
    store = DeadLetters(console.sessions)
    nap = {"task": "devtools.samples.nap", "args": [0.01], "kwargs": {}}
    for n in range(3):
        store.add("task", f"{tag}-ok-{n}", "cap", nap)
    store.add("task", f"{tag}-bare", "cap", {"only": "a head"})  # keeps no task
    replayed = _data(operator.request(
        f"/api/deadletters/{store.recent(2)[1].id}/replay", {}, _token(operator)))
    assert replayed["task_id"]
    token = _token(operator)
    shown = _data(operator.request("/api/deadletters/bulk?" + _query(search=tag)))
    assert (shown["count"], shown["unreplayed"]) == (4, 3)
    done = _data(operator.request("/api/deadletters/bulk", {
        "action": "replay", "kind": "", "search": tag, "upto": str(shown["upto"]),
        "expected": "4"}, token))
    assert (done["done"], done["already_replayed"], done["not_replayable"]) == (2, 1, 1)
    assert done["stopped"] is None
    with console.engine.connect() as conn:
        rows = conn.execute(select(DEAD_LETTERS.c.ref, DEAD_LETTERS.c.replay_task_id).where(
            DEAD_LETTERS.c.ref.startswith(tag))).all()
    sent = {ref: task for ref, task in rows}
    assert all(sent[f"{tag}-ok-{n}"] for n in range(3)) and sent[f"{tag}-bare"] is None
    again = _data(operator.request("/api/deadletters/bulk", {
        "action": "replay", "kind": "", "search": tag, "upto": str(shown["upto"]),
        "expected": "4"}, token))
    assert (again["done"], again["already_replayed"], again["not_replayable"]) == (0, 3, 1)
    page = operator.request("/deadletters?kind=task&search=x")
    assert page.status == 200 and "letters.js" in page.body and 'value="x"' in page.body


def test_a_bulk_replay_whose_send_fails_stops_there_and_says_so(console: Console) -> None:
    tag = uuid.uuid4().hex[:8]
    store = DeadLetters(console.sessions)
    for n in range(3):
        store.add("task", f"{tag}-{n}", "cap", {"task": "devtools.samples.nap", "args": [0.01],
                                                "kwargs": {}})
    found = LetterFilter("task", tag)
    shown = preview(console.sessions, found)
    sent: list[str] = []

    def send(name: str, args: list[Any], kwargs: dict[str, Any], task_id: str) -> None:
        if len(sent) == 1:
            raise ConnectionError("broker away (redis://:hunter2@h:6379/0)")
        sent.append(task_id)

    report = replay_matching(console.sessions, found, shown.upto, 3, send)
    second = shown.upto - 1
    assert (report.done, report.stopped) == (
        1, f"letter {second}: ConnectionError: broker away (redis://:***@h:6379/0)")
    replayed = {s.ref: s.replay_task_id for s in store.recent(3)}
    assert replayed == {f"{tag}-0": sent[0], f"{tag}-1": None, f"{tag}-2": None}


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_search_and_bulk_on_postgresql_and_mariadb(kind: str) -> None:
    engine = fresh_database(DATABASES[kind])
    try:
        sessions = sessionmaker(engine)
        ids = _letters(sessions, "db")
        for search, found in (("50%_", {"pct"}), ("a_b", {"under"}), ("BOOM", {"pct", "near"}),
                              ("!", set())):
            got = preview(sessions, LetterFilter("task", search))
            assert got.count == len(found), (kind, search)
        sent: list[str] = []
        report = replay_matching(sessions, LetterFilter(None, "fine"), ids["x"], 2,
                                 lambda name, args, kwargs, task_id: sent.append(task_id))
        assert (report.done, len(sent)) == (2, 2)
        with pytest.raises(FilterChanged):
            purge_matching(sessions, LetterFilter("task", "50"), ids["quiet"], 3)
        assert purge_matching(sessions, LetterFilter("task", "50"), ids["quiet"], 2).done == 2
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(DEAD_LETTERS)).scalar() == 3
    finally:
        engine.dispose()


# -- CSV upload ------------------------------------------------------------------------------

def _multipart(files: dict[str, tuple[str, bytes]], fields: list[tuple[str, str]]
               ) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
             f"{value}\r\n".encode() for name, value in fields]
    parts += [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
              f'filename="{filename}"\r\nContent-Type: text/csv\r\n\r\n'.encode() + body
              + b"\r\n" for name, (filename, body) in files.items()]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), boundary


def _upload(client: Browserless, job: str, body: bytes, token: dict[str, str],
            params: tuple[str, ...] = ()) -> Answer:
    import urllib.error
    import urllib.request

    data, boundary = _multipart({"csv": ("people.csv", body)}, [("param", p) for p in params])
    request = urllib.request.Request(
        f"{client.base}/api/jobs/{job}/upload", data=data, method="POST",
        headers={**token, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with client.opener.open(request, timeout=30) as response:
            return Answer(response.status, dict(response.headers), response.read().decode(), [])
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, dict(exc.headers), exc.read().decode(), [])


def _csv_state(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        runs = conn.execute(select(func.count()).select_from(RANGE_RUNS).where(
            RANGE_RUNS.c.job == "csv_copy")).scalar_one()
        lines = conn.execute(select(func.count()).select_from(RUN_INPUT)).scalar_one()
    return int(runs), int(lines)


def test_a_csv_upload_starts_a_run_with_its_input_and_a_bad_one_writes_nothing(
        console: Console, operator: Browserless) -> None:
    token = _token(operator)
    bad = b"id,name\n1,ann\n2,bob,extra\n3,cy\n"
    refused = _upload(operator, "csv_copy", bad, token)
    assert refused.status == 409, refused.body
    assert refused.json()["error"] == "people.csv: line 3: 3 fields, but the header has 2"
    for wrong in (b"", b"\xff\xfe,x\n", b"id,id\n1,2\n"):
        assert _upload(operator, "csv_copy", wrong, token).status == 409
    assert _csv_state(console.engine) == (0, 0)  # no phantom run, no input rows
    assert _upload(operator, "csv_copy", b"id,name\n1,a\n", {}).status == 403
    assert _upload(operator, "cm_data", b"id,name\n1,a\n", token).status == 409
    assert _upload(operator, "no_such_job", b"id,name\n1,a\n", token).status == 404
    assert _csv_state(console.engine) == (0, 0)
    page = operator.request("/jobs/csv_copy/upload")
    assert page.status == 200 and 'id="upload-form"' in page.body
    assert 'href="/jobs/csv_copy/upload"' in operator.request("/jobs/csv_copy/runs").body

    good = b"id,name\n" + b"".join(b"%d,name-%d\n" % (i, i) for i in range(1, 1201))
    started = _data(_upload(operator, "csv_copy", good, token))
    assert (started["run"], started["input_lines"]) == (1, 1200)
    assert _csv_state(console.engine) == (1, 1200)
    run = _data(operator.request("/api/jobs/csv_copy/runs/1"))
    assert run["started_by"].startswith("console:operator@127.0.0.1")


def test_an_upload_over_the_size_limit_is_refused_before_its_body_is_read(
        console: Console, operator: Browserless) -> None:
    from tasks.console.ops import MAX_UPLOAD_BYTES

    cookies = "; ".join(f"{c.name}={c.value}" for c in operator.jar)
    token = operator.csrf()
    host, port = console.base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", "/api/jobs/csv_copy/upload")
        for name, value in (("Cookie", cookies), ("X-CSRF-Token", token),
                            ("Content-Type", "multipart/form-data; boundary=x"),
                            ("Content-Length", str(MAX_UPLOAD_BYTES + 1))):
            conn.putheader(name, value)
        conn.endheaders()  # and no body: the answer comes before it
        answer = conn.getresponse()
        assert answer.status == 413
        assert f"at most {MAX_UPLOAD_BYTES:,} are taken" in json.loads(answer.read())["error"]
    finally:
        conn.close()
    assert _csv_state(console.engine)[0] <= 1  # the upload test's run at most: none added
