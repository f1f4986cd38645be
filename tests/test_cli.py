"""`python -m tasks` commands and the demo, run as a user runs them."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from bench.cm_data import cm_data
from tasks.ranges.reconciler import activate, reconcile_job
from tasks.ranges.tables import WORK
from tasks.store.resources import make_engine
from tests.support import forkcli
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, platform_env


def tasks_cli(
    env: dict[str, str], *args: str, timeout: float = 120, module: str = "tasks"
) -> subprocess.CompletedProcess[str]:
    """A command as a user runs it; the short ones through the test process's fork server
    (a busy machine spent most of a minute starting interpreters for one test's ten calls)."""
    argv = [sys.executable, "-m", module, *args]
    if module in ("tasks", "examples.seed"):
        return forkcli.run(argv, env, ROOT, timeout)
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_migrate_the_example_seed_and_status(private_redis: RedisServer, tmp_path: Path) -> None:
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=f"sqlite:///{tmp_path}/c.db",
                       COLUMNS="200")
    early = tasks_cli(env, "status")
    assert early.returncode == 1 and "run `python -m tasks migrate`" in early.stderr
    first = tasks_cli(env, "migrate").stdout
    assert "applied 0001: Work table and schedule table" in first
    assert "schema is up to date (0 migrations applied)" not in first
    assert "schema is up to date (0 migrations applied)" in tasks_cli(env, "migrate").stdout
    # The example's seeder (a user's project: it creates its own table, then appends rows).
    assert "seeded ids 1..300" in tasks_cli(env, "--rows", "300", module="examples.seed").stdout
    assert "seeded ids 301..310" in tasks_cli(env, "--rows", "10", module="examples.seed").stdout
    empty = tasks_cli(env, "status")
    assert empty.returncode == 0 and "no range job has partitions yet" in empty.stdout
    bad = tasks_cli(env, "--rows", "-5", module="examples.seed")
    assert bad.returncode == 2 and "--rows must be at least 0, not -5" in bad.stderr
    assert tasks_cli(env, "seed", "--rows", "3").returncode == 2  # no longer the platform's
    engine = make_engine(env["DATABASE_URL"])
    sessions = sessionmaker(engine)
    activate(sessions, cm_data)
    client = redis.Redis.from_url(private_redis.url)
    reconcile_job(sessions, client, cm_data, lambda _j, _p: None, interval=1, grace=0)
    with engine.begin() as conn:
        conn.execute(update(WORK).values(status="failed", error="ValueError: row 7 is bad"))
    shown = tasks_cli(env, "status").stdout
    assert "cm_data" in shown and "1..2000000" in shown
    assert "failed: ValueError: row 7 is bad" in shown
    engine.dispose()


@pytest.mark.timeout(240)
def test_the_demo_verifies_exactly_once_after_a_kill(private_redis: RedisServer) -> None:
    env = platform_env(REDIS_URL=private_redis.url, COLUMNS="200")
    demo = tasks_cli(env, "demo", "--rows", "30000", "--partition-size", "5000",
                     "--batch-size", "250", "--lease-ttl", "1.5", "--batch-delay", "0.05",
                     "--chaos", timeout=220, module="devtools")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "chaos: kill -9 worker1" in demo.stdout
    assert "processed exactly once: 30,000" in demo.stdout
    assert "exactly once: yes" in demo.stdout


@pytest.mark.timeout(180)
def test_the_demo_shows_unpaid_stock_coming_back(private_redis: RedisServer) -> None:
    env = platform_env(REDIS_URL=private_redis.url, COLUMNS="200")
    demo = tasks_cli(env, "demo", "--rows", "2000", "--partition-size", "1000", "--restock",
                     "--restock-delay", "1.5", timeout=170, module="devtools")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "restock scenario" in demo.stdout
    assert "every SKU at total - paid" in demo.stdout
    assert "restocked exactly once: yes" in demo.stdout


def test_the_embedded_redis_starts_answers_and_stops() -> None:
    from devtools.embedded import EmbeddedRedis, redis_answers

    server = EmbeddedRedis().start()
    try:
        assert redis_answers(port=server.port)
        assert server.url.startswith("redis://127.0.0.1:")
    finally:
        server.stop()
    assert not redis_answers(port=server.port)


SENTINEL = "platform:live-data"


@pytest.mark.parametrize("command", [
    ["-m", "devtools", "demo", "--rows", "10"],
    ["-m", "bench", "overhead", "--tasks", "1", "--rounds", "1"],
    ["-m", "bench", "range", "--rows", "10"],
    ["-m", "bench", "restock", "--entries", "10"],
    ["-m", "bench", "lease", "--n", "10", "--url", "<redis>"],
])
def test_demo_and_benchmarks_refuse_a_redis_database_they_did_not_create(
    private_redis: RedisServer, command: list[str]
) -> None:
    """Issue 9 item 13: with REDIS_URL (or --url) at a live database, nothing is flushed."""
    client = redis.Redis.from_url(private_redis.url)
    client.set(SENTINEL, "keep me")
    client.hset("platform:other", "field", "1")
    argv = [private_redis.url if arg == "<redis>" else arg for arg in command]
    run = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                         env=platform_env(REDIS_URL=private_redis.url), timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "refusing to use" in run.stderr and "2 key(s)" in run.stderr
    assert "rangekeeper:scratch" in run.stderr
    assert client.get(SENTINEL) == b"keep me" and client.dbsize() == 2


def test_a_scratch_database_is_claimed_only_when_empty_and_flushed_only_when_marked(
    private_redis: RedisServer,
) -> None:
    from devtools.embedded import SCRATCH_MARKER, NotScratch, claim_scratch, flush_scratch

    client = redis.Redis.from_url(private_redis.url)
    with pytest.raises(NotScratch, match="refusing to flush"):
        flush_scratch(client)
    claim_scratch(private_redis.url, "demo")
    client.set("demo:key", 1)
    claim_scratch(private_redis.url, "demo")  # marked: claimed again, though not empty
    flush_scratch(client)
    assert client.keys("*") == [SCRATCH_MARKER.encode()]
    client.delete(SCRATCH_MARKER)
    client.set(SENTINEL, "x")
    with pytest.raises(NotScratch, match=r"1 key\(s\)"):
        claim_scratch(private_redis.url, "demo")
    with pytest.raises(NotScratch):
        flush_scratch(client)
    assert client.keys("*") == [SENTINEL.encode()]


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres@127.0.0.1:5432/rangekeeper_no_such_db",
    "mysql+pymysql://root@127.0.0.1:3306/rangekeeper_no_such_db",
    "sqlite:///<tmp>/missing/dir/x.sqlite",
    "sqlite:///<tmp>/x.sqlite",
])
def test_status_on_a_database_that_does_not_exist_says_so_without_a_traceback(
    private_redis: RedisServer, tmp_path: Path, url: str
) -> None:
    """Issue 9 item 16: one clear line and a non-zero exit, and no SQLite file is created."""
    url = url.replace("<tmp>", str(tmp_path))
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=url)
    run = tasks_cli(env, "status")
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert ("does not exist" in run.stderr or "Unknown database" in run.stderr), run.stderr
    assert "DATABASE_URL=" in run.stderr
    assert not list(tmp_path.rglob("*.sqlite"))


@pytest.mark.parametrize(("overrides", "args", "expected"), [
    ({"LEASE_TTL": "abc"}, ("status",), "LEASE_TTL='abc' is not a number"),
    ({"EXTRA_TASK_MODULES": "nosuch.jobs"}, ("status",),
     "EXTRA_TASK_MODULES names 'nosuch.jobs', which cannot be imported"),
    ({"EXTRA_TASK_MODULES": "nosuch.jobs"}, ("jobs", "runs", "cm_data"),
     "EXTRA_TASK_MODULES names 'nosuch.jobs', which cannot be imported"),
    ({"REDIS_URL_FILE": "/nonexistent/redis_url"}, ("status",),
     "REDIS_URL_FILE='/nonexistent/redis_url': cannot read it"),
])
def test_a_bad_setting_or_module_is_one_line_naming_it(
    tmp_path: Path, overrides: dict[str, str], args: tuple[str, ...], expected: str
) -> None:
    env = platform_env(DATABASE_URL=f"sqlite:///{tmp_path}/c.db", **overrides)
    if "REDIS_URL_FILE" in overrides:
        env.pop("REDIS_URL", None)
    done = tasks_cli(env, *args, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m tasks: {expected}"), lines


def test_the_console_script_has_a_version_and_shell_completion(tmp_path: Path) -> None:
    env = platform_env(DATABASE_URL=f"sqlite:///{tmp_path}/c.db")
    script = Path(sys.executable).with_name("rangekeeper")
    version = subprocess.run([str(script), "--version"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0
    assert version.stdout.strip() == f"rangekeeper {importlib.metadata.version('rangekeeper')}"
    bash = subprocess.run([str(script), "completion", "bash"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert bash.returncode == 0 and "_RANGEKEEPER_COMPLETE=bash_complete" in bash.stdout
    # The script it prints completes the real commands.
    env.update(_RANGEKEEPER_COMPLETE="bash_complete", COMP_WORDS="rangekeeper jo", COMP_CWORD="1")
    words = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert "plain,jobs" in words.stdout.splitlines()


def test_database_schema_puts_every_table_in_its_own_postgresql_schema_and_url_options_stay(
    private_redis: RedisServer
) -> None:
    from sqlalchemy import text

    from tests.support.db import DATABASES, ensure_databases

    ensure_databases()
    url = DATABASES["postgresql"]
    schema = f"rk_schema_{os.getpid()}"
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=url, DATABASE_SCHEMA=schema)
    admin = make_engine(url)
    try:
        done = tasks_cli(env, "migrate")
        assert done.returncode == 0, done.stderr
        assert "applied 0001" in done.stdout
        with admin.connect() as conn:
            tables = set(conn.execute(text(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": schema}).scalars())
        assert {"work_items", "range_runs", "dead_letters", "alembic_version"} <= tables
        assert tasks_cli(env, "status").returncode == 0  # the platform finds its tables there
        # Options given in DATABASE_URL are kept beside the platform's own.
        engine = make_engine(f"{url}?options=-c%20application_name%3Drk-options-test",
                             idle_timeout=5, schema=schema)
        with engine.connect() as conn:
            assert conn.execute(text("SHOW application_name")).scalar() == "rk-options-test"
            assert conn.execute(text("SHOW search_path")).scalar() == schema
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "10s"
        engine.dispose()
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def test_database_schema_is_refused_off_postgresql(tmp_path: Path) -> None:
    env = platform_env(DATABASE_URL=f"sqlite:///{tmp_path}/c.db", DATABASE_SCHEMA="app")
    done = tasks_cli(env, "migrate")
    assert done.returncode == 2 and "DATABASE_SCHEMA applies to PostgreSQL only" in done.stderr
    bad = tasks_cli(platform_env(DATABASE_URL=f"sqlite:///{tmp_path}/c.db",
                                 DATABASE_SCHEMA="App; DROP"), "status")
    assert bad.returncode == 2 and "DATABASE_SCHEMA='App; DROP' must match" in bad.stderr
