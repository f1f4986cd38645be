"""Run history that tells the truth on re-runs (issue 21): a second run's rows, progress and ETA
count only its own work; run numbers count per job; a run shows its duration, who started it
and its parameters; a failed partition leaves its error and traceback; skipped rows are
counted on the run and run again once by `jobs retry-skipped` or a replayed `range-skip`
letter. Real workers wherever a run is involved."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, column, insert, select, table, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

import bench.cm_data  # noqa: F401  (registers the cm_data job in this process)
import tests.support.control_jobs  # noqa: F401  (registers cm_flaky in this process)
from examples.seed import seed_cm_data
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.ranges.controls import Controls
from tasks.ranges.runs import current_run, current_runs, run_counts, runs_of
from tasks.ranges.skips import SKIP_KIND
from tasks.ranges.tables import RANGE_RUNS, SCHEDULES, RunState
from tasks.store.db import utcnow
from tests.ranges.cluster import DATA, Platform
from tests.ranges.control_support import control_platform, events, jobs_cli, runs
from tests.support import forkcli
from tests.support.control_jobs import BOOM
from tests.support.redis_server import free_port
from tests.support.workers import ROOT, celery_call, wait_until
from tests.test_console_http import PASSWORD, USER, Browserless, start_console

pytestmark = pytest.mark.timeout(180)


def cli(cluster: Platform, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m tasks ARGS...` as an operator types it."""
    return forkcli.run([sys.executable, "-m", "tasks", *args], cluster.env, ROOT, 60)


def refused(done: subprocess.CompletedProcess[str], said: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def processed(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(i): int(n) for i, n in conn.execute(
            select(DATA.c.id, DATA.c.processed_count))}


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
def test_run_numbers_count_per_job_with_two_jobs_interleaved(engine: Engine,
                                                             redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 10)
    sessions = sessionmaker(engine, expire_on_commit=False)
    controls = Controls(sessions, redis_client, lambda _job: {"dispatched": []})
    order = [("start", "cm_data"), ("start", "cm_flaky"), ("cancel", "cm_data"),
             ("start", "cm_data"), ("start", "cm_data"),  # joins the live run 2
             ("cancel", "cm_flaky"), ("start", "cm_flaky"), ("cancel", "cm_data"),
             ("start", "cm_data")]
    reports = [(verb, getattr(controls, verb)(job, f"ops@{job}")) for verb, job in order]
    assert [r["run"] for verb, r in reports if verb == "start"] == [1, 1, 2, 2, 2, 3]
    with engine.connect() as conn:
        stored = conn.execute(select(RANGE_RUNS.c.id, RANGE_RUNS.c.job, RANGE_RUNS.c.number,
                                     RANGE_RUNS.c.started_by).order_by(RANGE_RUNS.c.id)).all()
    assert [(r.job, r.number) for r in stored] == [
        ("cm_data", 1), ("cm_flaky", 1), ("cm_data", 2), ("cm_flaky", 2), ("cm_data", 3)]
    assert {r.started_by for r in stored if r.job == "cm_data"} == {"ops@cm_data"}
    # The global id stays the internal name; people read the number.
    newest = runs_of(sessions, "cm_data")[0].as_dict()
    assert (newest["run"], newest["id"], newest["started_by"]) == (3, stored[-1].id,
                                                                   "ops@cm_data")
    assert newest["duration_s"] >= 0 and newest["finished_at"] is None
    # Every job's current run in one read (a status of many jobs) is each job's own.
    names = ("cm_data", "cm_flaky", "never_ran")
    with sessions() as session:
        counted = {job: run_counts(session, job) for job in names}
    assert current_runs(sessions, counted) == {job: current_run(sessions, job)
                                               for job in names[:2]}
    live = current_runs(sessions, {"cm_data": (7, 2)})["cm_data"]
    assert (live.number, live.rows, live.skipped) == (3, 7 - live.rows_base, 2)
    # The database itself refuses a second run 3 of cm_data.
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(RANGE_RUNS).values(job="cm_data", number=3, state="running",
                                               started_at=utcnow(), updated_at=utcnow(),
                                               rows=0, rows_base=0))


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_second_run_counts_only_its_own_rows_progress_and_eta(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 3000)
    cluster = platform(CM_DATA_PARTITION_SIZE="1000")
    first = cluster.worker("a")
    cluster.beat()
    cluster.start_job()
    wait_until(lambda: [r.state for r in runs(engine)] == [RunState.SUCCEEDED], 60,
               "run 1 succeeded")
    # 1,000 rows come to match again; run 2 is held at 20 rows/s before a worker runs it (50 s
    # for them: a busy machine's slow `status` calls still find it midway).
    first.stop()
    with engine.begin() as conn:
        conn.execute(update(DATA).where(DATA.c.id <= 1000).values(status=0))
    cluster.start_held(20)
    cluster.worker("b")

    def midway() -> dict[str, Any] | None:
        [job] = json.loads(cli(cluster, "status", "--json").stdout)["item"]["jobs"]
        return job if job["rows_done"] >= 200 and job["eta_s"] is not None else None

    job = wait_until(midway, 60, "run 2 under way")
    assert job["run"] == 2 and job["state"] == RunState.RUNNING
    assert job["rows_done"] < 1000 and job["ids_walked"] < job["ids_planned"] == 3000
    assert job["eta_s"] > 0
    text = cli(cluster, "status").stdout
    assert "(run 2)" in text and "100.0%" not in text, text
    history = json.loads(jobs_cli(cluster, "runs", "cm_data", "--json").stdout)["items"]
    assert [r["run"] for r in history] == [2, 1]
    assert 200 <= history[0]["rows"] < 1000 and history[1]["rows"] == 3000
    cluster.throttle(0)
    wait_until(lambda: [r.state for r in runs(engine)] == [RunState.SUCCEEDED] * 2, 60,
               "run 2 succeeded")
    assert [r.rows for r in runs(engine)] == [3000, 1000]
    [job] = json.loads(cli(cluster, "status", "--json").stdout)["item"]["jobs"]
    assert (job["rows_done"], job["ids_walked"], job["eta_s"]) == (1000, 3000, None)
    counts = processed(engine)
    assert all(counts[i] == (2 if i <= 1000 else 1) for i in counts)


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_failed_partition_shows_its_error_and_traceback(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    seed_cm_data(engine, 4000)
    with engine.begin() as conn:
        conn.execute(update(DATA).where(DATA.c.id == 3100).values(payload=BOOM))
    flaky = tmp_path / "flaky"
    flaky.touch()
    cluster = control_platform(platform, TEST_FLAKY_FILE=str(flaky))
    cluster.worker("a")
    cluster.beat()
    sent = celery_call(cluster.env, "tasks.ranges.start", "--args", '["cm_flaky"]')
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: runs(engine, "cm_flaky")[-1].state == RunState.FAILED, 60,
               "the run failed")
    listed = jobs_cli(cluster, "runs", "cm_flaky")
    assert listed.returncode == 0, listed.stderr
    assert "run 1  failed" in listed.stdout and "by task:" in listed.stdout
    assert "partition-failed by " in listed.stdout and "(part 1: ValueError: boom)" in listed.stdout
    assert "Traceback" not in listed.stdout  # one line per event in the list
    detail = json.loads(jobs_cli(cluster, "run", "cm_flaky", "1", "--json").stdout)["item"]
    assert (detail["run"], detail["state"], detail["rows"]) == (1, RunState.FAILED, 3000)
    assert detail["duration_s"] > 0 and detail["started_by"].startswith("task:")
    [failure] = detail["failures"]
    assert (failure["part"], failure["error"]) == (1, "ValueError: boom")
    assert failure["traceback"].startswith("Traceback (most recent call last)")
    assert "_fail_on_boom" in failure["traceback"]
    assert failure["traceback"].endswith("ValueError: boom")
    text = jobs_cli(cluster, "run", "cm_flaky", "1").stdout
    assert "part 1 failed at" in text and "    Traceback (most recent call last)" in text
    # The console's job page reads the same history.
    console, base = start_console(dict(cluster.env, CONSOLE_USER=USER, CONSOLE_PASSWORD=PASSWORD,
                                       CONSOLE_PORT=str(free_port())))
    try:
        operator = Browserless(base)
        assert operator.login().status == 302
        page = operator.request("/api/jobs/cm_flaky").json()["data"]
    finally:
        console.stop()
    assert (page["job"]["run"], page["job"]["rows_done"]) == (1, 3000)
    [shown] = page["runs"]
    assert (shown["run"], shown["started_by"], shown["rows"]) == (1, detail["started_by"], 3000)
    assert shown["duration_s"] == detail["duration_s"]
    [event] = [e for e in shown["events"] if e["verb"] == "partition-failed"]
    assert event["detail"].startswith("part 1: ValueError: boom\nTraceback")


def skip_letters(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(DEAD_LETTERS).where(DEAD_LETTERS.c.kind == SKIP_KIND)
                                 .order_by(DEAD_LETTERS.c.id)).all())


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_skipped_rows_are_counted_and_each_retried_once(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    seed_cm_data(engine, 2000)
    bad = tmp_path / "bad"
    bad.write_text("5,50,1500")
    cluster = platform(EXTRA_TASK_MODULES="bench.cm_data,tests.support.skip_jobs",
                       TEST_BAD_ROWS=str(bad))
    refused(jobs_cli(cluster, "retry-skipped", "cm_skippy"), "the job has no run")
    cluster.worker("a")
    cluster.beat()
    assert jobs_cli(cluster, "start", "cm_skippy").returncode == 0
    wait_until(lambda: [r.state for r in runs(engine, "cm_skippy")] == [RunState.SUCCEEDED],
               60, "run 1 succeeded")
    [run] = runs(engine, "cm_skippy")
    assert (run.rows, run.skipped) == (1997, 3)
    assert [(json.loads(r.payload)["row_id"], json.loads(r.payload)["run"])
            for r in skip_letters(engine)] == [(5, run.id), (50, run.id), (1500, run.id)]
    [job] = json.loads(cli(cluster, "status", "--json").stdout)["item"]["jobs"]
    assert (job["rows_done"], job["rows_skipped"]) == (1997, 3)
    # Row 5 is fixed, 50 is still bad, 1500 no longer matches the job's filter: 5 runs once
    # more, 50 is quarantined again, 1500 is not touched.
    bad.write_text("50")
    with engine.begin() as conn:
        conn.execute(update(DATA).where(DATA.c.id == 1500).values(status=2))
    retried = jobs_cli(cluster, "retry-skipped", "cm_skippy")
    assert retried.returncode == 0, retried.stderr
    assert "cm_skippy run 1: running (retried 3" in retried.stdout, retried.stdout
    wait_until(lambda: [r.state for r in runs(engine, "cm_skippy")] == [RunState.SUCCEEDED],
               60, "run 1 succeeded again")
    [run] = runs(engine, "cm_skippy")
    assert (run.rows, run.skipped) == (1998, 1)
    counts = processed(engine)
    assert {i for i, n in counts.items() if n != 1} == {50, 1500}
    assert counts[50] == counts[1500] == 0
    letters = skip_letters(engine)
    assert [r.replayed_at is not None for r in letters] == [True, True, True, False]
    assert json.loads(letters[-1].payload)["row_id"] == 50
    # A replay of 50's new letter runs that one row again; a second replay is refused.
    bad.write_text("")
    replayed = cli(cluster, "deadletters", "replay", str(letters[-1].id))
    assert replayed.returncode == 0, replayed.stderr
    assert "row 50 is out of quarantine and runs again in run 1" in replayed.stdout
    wait_until(lambda: [r.state for r in runs(engine, "cm_skippy")] == [RunState.SUCCEEDED],
               60, "run 1 succeeded a third time")
    cluster_rows = processed(engine)
    assert {i for i, n in cluster_rows.items() if n != 1} == {1500} and cluster_rows[1500] == 0
    [run] = runs(engine, "cm_skippy")
    assert (run.rows, run.skipped) == (1999, 0)
    assert events(engine, "cm_skippy").count("retry-skipped") == 2
    # Nothing left to retry, and bad input: one line, exit 1, nothing changed.
    def unchanged() -> Any:  # the run's own columns (the hooks' outbox moves on its own)
        return ([(r.state, r.rows, r.skipped, r.number, r.finished_at)
                 for r in runs(engine, "cm_skippy")], skip_letters(engine))

    before = unchanged()
    refused(jobs_cli(cluster, "retry-skipped", "cm_skippy"), "run 1 has no skipped rows")
    refused(cli(cluster, "deadletters", "replay", str(letters[-1].id)), "already replayed")
    refused(jobs_cli(cluster, "retry-skipped", "no_such_job"), "unknown range job")
    refused(jobs_cli(cluster, "run", "cm_skippy", "2"), "cm_skippy has no run 2")
    assert unchanged() == before
    assert processed(engine) == cluster_rows


def _both_read_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold each of two starting threads after its first read of the job's run until the
    other has read too: both see the same run before either writes."""
    import tasks.ranges.controls as module

    barrier, held, read = threading.Barrier(2, timeout=10), threading.local(), module.current_run

    def both_read_first(found_in: Any, job: str) -> Any:
        run = read(found_in, job)
        if not getattr(held, "read", False):
            held.read = True
            barrier.wait()
        return run

    monkeypatch.setattr(module, "current_run", both_read_first)


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"])
def test_two_starts_at_once_open_one_run(engine: Engine, redis_client: redis.Redis,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Both starts read "no run" before either writes (a barrier holds the first of them
    there until the second has read too): one opens run 1, the other joins it."""

    seed_cm_data(engine, 10)
    sessions = sessionmaker(engine, expire_on_commit=False)
    _both_read_first(monkeypatch)
    reports: list[dict[str, Any]] = []

    def start(who: str) -> None:
        controls = Controls(sessions, redis_client, lambda _job: {"dispatched": []})
        reports.append(controls.start("cm_data", who))

    threads = [threading.Thread(target=start, args=(who,)) for who in ("a@h", "b@h")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r["run"] for r in reports] == [1, 1]
    assert [(r.number, r.state) for r in runs(engine)] == [(1, RunState.RUNNING)]
    assert events(engine) == ["start", "start"]  # the second: "already running"


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
def test_a_start_that_commits_between_the_other_s_check_and_its_insert_is_joined(
        engine: Engine, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under PostgreSQL's READ COMMITTED each statement sees what committed before it: b
    checks "no run" inside its transaction, then a opens and commits run 1 before b goes on.
    b must not read the next number afresh (it would open run 2 beside a live run 1): it
    meets the unique number a took, rolls back and joins run 1. (Found by the barrier test
    above failing once in CI on PostgreSQL.)"""
    import tasks.ranges.controls as module

    seed_cm_data(engine, 10)
    sessions = sessionmaker(engine, expire_on_commit=False)
    a_done, check, held = threading.Event(), module.still_latest, threading.local()
    _both_read_first(monkeypatch)

    def b_waits_for_a_after_its_check(session: Any, job: str, run: Any) -> bool:
        still = check(session, job, run)
        if threading.current_thread().name == "b" and not getattr(held, "checked", False):
            held.checked = True
            assert a_done.wait(20), "a's start never committed"
        return still

    monkeypatch.setattr(module, "still_latest", b_waits_for_a_after_its_check)
    reports: dict[str, dict[str, Any]] = {}

    def start(who: str) -> None:
        controls = Controls(sessions, redis_client, lambda _job: {"dispatched": []})
        reports[who] = controls.start("cm_data", f"{who}@h")
        if who == "a":
            a_done.set()

    threads = [threading.Thread(target=start, args=(who,), name=who) for who in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert {who: r["run"] for who, r in reports.items()} == {"a": 1, "b": 1}
    assert [(r.number, r.state) for r in runs(engine)] == [(1, RunState.RUNNING)]
    assert events(engine) == ["start", "start"]


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
def test_migration_0015_numbers_older_runs_per_job_and_names_their_starters(
        engine: Engine) -> None:
    from devtools.demo import reset_database
    from tasks.store.migrate import upgrade

    reset_database(engine)
    upgrade(engine, "0014")
    now = utcnow()
    old_runs = table("range_runs", column("id"), column("job"), column("state"),
                     column("started_at"), column("updated_at"), column("rows"),
                     column("rows_base"))
    old_events = table("range_run_events", column("run_id"), column("job"), column("verb"),
                       column("actor"), column("at"))
    with engine.begin() as conn:
        for run_id, job in ((1, "a"), (2, "b"), (3, "a"), (4, "a")):
            conn.execute(insert(old_runs).values(id=run_id, job=job, state="succeeded",
                                                 started_at=now, updated_at=now, rows=0,
                                                 rows_base=0))
            conn.execute(insert(old_events).values(run_id=run_id, job=job, verb="start",
                                                   actor=f"ops{run_id}@h", at=now))
    upgrade(engine)
    with engine.connect() as conn:
        got = conn.execute(select(RANGE_RUNS.c.id, RANGE_RUNS.c.number,
                                  RANGE_RUNS.c.started_by, RANGE_RUNS.c.skipped)
                           .order_by(RANGE_RUNS.c.id)).all()
    assert [tuple(r) for r in got] == [(1, 1, "ops1@h", 0), (2, 1, "ops2@h", 0),
                                       (3, 2, "ops3@h", 0), (4, 3, "ops4@h", 0)]


def _to_the_end(job: Any, sessions: sessionmaker[Any], leases: Any,
                client: redis.Redis) -> Any:
    """Run the job's open partitions here, then one reconcile round (due now) to close it."""
    from tasks.ranges.reconciler import reconcile_job
    from tests.ranges.inprocess import run_all

    run_all(job, sessions, leases, client)
    with sessions.begin() as session:
        session.execute(update(SCHEDULES).values(next_run_at=SCHEDULES.c.updated_at))
    return reconcile_job(sessions, client, job, lambda _j, _p: None, interval=60, grace=0)


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"])
def test_a_replayed_letter_of_an_older_run_runs_its_row_in_the_latest_run(
        engine: Engine, redis_client: redis.Redis, leases: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.celery  # noqa: F401  (registers the wings' dead-letter kinds)
    from tasks.deadletters.store import DeadLetters
    from tests.support.skip_jobs import cm_skippy

    bad = tmp_path / "bad"
    bad.write_text("7")
    monkeypatch.setenv("TEST_BAD_ROWS", str(bad))
    seed_cm_data(engine, 1000)
    sessions = sessionmaker(engine, expire_on_commit=False)
    controls = Controls(sessions, redis_client, lambda _job: {"dispatched": []})
    for _ in range(2):  # run 1 quarantines row 7; run 2 leaves it out
        controls.start("cm_skippy", "t")
        assert _to_the_end(cm_skippy, sessions, leases, redis_client).run == RunState.SUCCEEDED
    assert [(r.rows, r.skipped) for r in runs(engine, "cm_skippy")] == [(999, 1), (0, 0)]
    [letter] = skip_letters(engine)
    bad.write_text("")
    done = DeadLetters(sessions).replay(letter.id, lambda *_args: None)
    assert done.note == "row 7 is out of quarantine and runs again in run 2 of cm_skippy " \
                        "(running)"
    assert [(r.state, r.skipped) for r in runs(engine, "cm_skippy")] == [
        (RunState.SUCCEEDED, 0), (RunState.RUNNING, 0)]
    assert _to_the_end(cm_skippy, sessions, leases, redis_client).run == RunState.SUCCEEDED
    assert [(r.rows, r.skipped) for r in runs(engine, "cm_skippy")] == [(999, 0), (1, 0)]
    assert set(processed(engine).values()) == {1}
