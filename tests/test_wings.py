"""Wings you can turn off (issue 22): the setting WINGS (`tasks.wings.enabled`), `migrate`
creating only the enabled wings' tables on a fresh PostgreSQL schema and a fresh SQLite file
and the tables of a wing turned on later on the next `migrate`, and an app (and a real worker)
with restock off that has none of its tasks, queues, beat entries or dead-letter kinds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, inspect, text

from tasks.celery import configure
from tasks.config.settings import SettingsError
from tasks.wings import WINGS, enabled, load_settings, load_tables
from tests.support import forkcli
from tests.support.db import DATABASES
from tests.support.workers import ROOT, platform_env, start_worker

pytestmark = pytest.mark.timeout(180)

RESTOCK_TABLES = {"skus", "orders", "order_items", "payments", "restock_nodes"}
ROLLBACK_TABLES = {"rollback_journal", "rollback_owners"}
RANGES_TABLES = {"work_items", "schedules", "range_runs", "range_run_events",
                 "range_job_schedules", "range_run_input"}
CORE_TABLES = {"dead_letters", "alembic_version"}
NO_RESTOCK = "ranges,rollback"


class Database:
    """A fresh database of one kind: a SQLite file, or a PostgreSQL schema of its own
    (DATABASE_SCHEMA) dropped at the end."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        name = f"wings_{uuid.uuid4().hex[:10]}"
        if kind == "sqlite":
            self.url, self.schema = f"sqlite:///{tmp_path}/{name}.sqlite", None
        else:
            self.url, self.schema = DATABASES["postgresql"], name
        self.engine: Engine = create_engine(self.url)

    def env(self, **extra: str) -> dict[str, str]:
        env = platform_env(DATABASE_URL=self.url, **extra)
        for name in ("WINGS", "DATABASE_SCHEMA"):
            env.pop(name, None)
        if self.schema:
            env["DATABASE_SCHEMA"] = self.schema
        env.update(extra)
        return env

    def migrate(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return forkcli.run([sys.executable, "-m", "tasks", "migrate"], self.env(**extra), ROOT, 120)

    def tables(self) -> set[str]:
        return set(inspect(self.engine).get_table_names(schema=self.schema))

    def shape(self, table: str) -> tuple[list[str], list[str]]:
        """A table's columns and index names, as the database reports them."""
        found = inspect(self.engine)
        columns = sorted(c["name"] for c in found.get_columns(table, schema=self.schema))
        indexes = sorted(str(i["name"]) for i in found.get_indexes(table, schema=self.schema))
        return columns, indexes

    def versions(self) -> list[str]:
        prefix = f'"{self.schema}".' if self.schema else ""
        with self.engine.connect() as conn:
            found = conn.execute(text(f"SELECT version_num FROM {prefix}alembic_version"))
            return list(found.scalars())

    def drop(self) -> None:
        if self.schema:
            with self.engine.begin() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
        self.engine.dispose()


@pytest.fixture
def databases(tmp_path: Path) -> Iterator[Callable[[str], Database]]:
    made: list[Database] = []

    def make(kind: str) -> Database:
        made.append(Database(kind, tmp_path))
        return made[-1]

    yield make
    for database in made:
        database.drop()


@pytest.mark.parametrize("kind, wings, absent", [
    ("sqlite", NO_RESTOCK, RESTOCK_TABLES),
    ("postgresql", NO_RESTOCK, RESTOCK_TABLES),
    ("sqlite", "restock", RANGES_TABLES | ROLLBACK_TABLES),
])
def test_migrate_creates_a_wing_s_tables_only_while_it_is_enabled(
        databases: Callable[[str], Database], kind: str, wings: str, absent: set[str]) -> None:
    db = databases(kind)
    off = db.migrate(WINGS=wings)
    assert off.returncode == 0, off.stderr
    assert db.tables() & absent == set()
    assert CORE_TABLES <= db.tables() and db.tables() - CORE_TABLES
    assert "cm_data" not in db.tables()  # the example's table: `python -m examples.seed` only
    assert "(skipped: its wing is off)" in off.stdout
    again = db.migrate(WINGS=wings)
    assert "(0 migrations applied)" in again.stdout, again.stdout
    assert db.tables() & absent == set()
    on = db.migrate()  # WINGS unset: every wing
    assert on.returncode == 0, on.stderr
    assert "applied 0004: again, for a wing turned on" in on.stdout or "restock" in wings
    assert "applied 0001: again, for a wing turned on" in on.stdout or "ranges" in wings
    assert absent <= db.tables() and "cm_data" not in db.tables()
    assert "(0 migrations applied)" in db.migrate().stdout
    # The tables made late are the tables of a database migrated with every wing on.
    reference = databases(kind)
    assert reference.migrate().returncode == 0
    assert reference.tables() == db.tables()
    for table in sorted(reference.tables()):
        assert db.shape(table) == reference.shape(table), table
    assert db.versions() == reference.versions()  # one history at its head: nothing stamped


def test_a_wing_turned_off_later_keeps_its_tables(databases: Callable[[str], Database]) -> None:
    db = databases("sqlite")
    assert db.migrate().returncode == 0
    off = db.migrate(WINGS="ranges")
    assert off.returncode == 0 and "(0 migrations applied)" in off.stdout
    assert RESTOCK_TABLES | ROLLBACK_TABLES <= db.tables()


def test_a_bad_wing_name_is_one_line_naming_the_variable_and_the_wings_and_changes_nothing(
        databases: Callable[[str], Database]) -> None:
    db = databases("sqlite")
    bad = db.migrate(WINGS="ranges,stock")
    assert bad.returncode == 2  # the CLI's exit code for a bad setting
    assert bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "WINGS: 'stock' is not one of ranges, rollback, restock" in bad.stderr
    assert db.tables() == set()
    with pytest.raises(SettingsError, match="WINGS: 'Restock' is not one of"):
        load_settings({"WINGS": "Restock"})


@pytest.mark.parametrize("raw, names", [
    ("", ["ranges", "rollback", "restock"]),
    ("restock, ranges", ["ranges", "restock"]),
    ("ranges,ranges", ["ranges"]),
    ("none", []),
])
def test_the_setting_names_the_enabled_wings(raw: str, names: list[str]) -> None:
    assert [w.name for w in enabled({"WINGS": raw})] == names


def test_the_tables_of_a_wing_turned_off_are_not_in_the_metadata() -> None:
    without = {w for w in WINGS if w.name != "restock"}
    tables = set(load_tables(tuple(without)).tables)
    assert tables & RESTOCK_TABLES == set() and ROLLBACK_TABLES <= tables
    assert RESTOCK_TABLES <= set(load_tables(WINGS).tables)


def test_the_configuration_without_restock_has_none_of_its_queues_routes_or_beat_entries(
) -> None:
    settings = load_settings({})
    without = tuple(w for w in WINGS if w.name != "restock")
    full, cut = configure(settings, WINGS), configure(settings, without)
    assert any("restock" in q.name for q in full["task_queues"])
    assert not any("restock" in q.name for q in cut["task_queues"])
    assert "restock-tick" in full["beat_schedule"] and "restock-tick" not in cut["beat_schedule"]
    assert "restock" in json.dumps(full["task_routes"], default=str)
    assert "restock" not in json.dumps(cut["task_routes"], default=str)


APP_PROBE = """
import json, sys
from tasks.celery import WINGS, app
from tasks.deadletters.kinds import kinds
from tasks.observe.metrics import Metrics
app.loader.import_default_modules()
metrics = Metrics([w.series for w in app.platform_wings if w.series is not None])
print(json.dumps({
    "wings": [w.name for w in WINGS],
    "tasks": sorted(app.tasks),
    "queues": sorted(q.name for q in app.conf.task_queues),
    "beat": sorted(app.conf.beat_schedule),
    "kinds": sorted(kinds()),
    "series": sorted(c.__module__ for c in metrics.wings),
    "modules": sorted(m for m in sys.modules if m.startswith(("tasks.restock.tasks",
                                                             "tasks.restock.drain"))),
}))
"""


def _probe(**env: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", APP_PROBE], env=platform_env(**env), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_app_with_restock_off_registers_nothing_of_it() -> None:
    full = _probe(WINGS="")
    assert any(t.startswith("tasks.restock.") for t in full["tasks"])
    cut = _probe(WINGS=NO_RESTOCK)
    assert cut["wings"] == ["ranges", "rollback"]
    assert [t for t in cut["tasks"] if t.startswith("tasks.restock.")] == []
    assert any(t.startswith("tasks.ranges.") for t in cut["tasks"])
    assert [q for q in cut["queues"] if "restock" in q] == []
    assert "restock-tick" in full["beat"] and "restock-tick" not in cut["beat"]
    assert set(full["kinds"]) - set(cut["kinds"]) and not any(
        "restock" in k for k in cut["kinds"])
    assert "tasks.restock.metrics" in full["series"]
    assert "tasks.restock.metrics" not in cut["series"]
    assert "tasks.restock.tasks" in full["modules"] and "tasks.restock.tasks" not in cut["modules"]


def test_a_worker_starts_with_restock_off(databases: Callable[[str], Database],
                                          worker_env: dict[str, str]) -> None:
    db = databases("sqlite")
    assert db.migrate(WINGS=NO_RESTOCK).returncode == 0
    env = dict(worker_env, DATABASE_URL=db.url, WINGS=NO_RESTOCK)
    worker = start_worker(env, 1, "wingless")
    try:
        out = worker.output()
        assert "tasks.ranges.start" in out  # the banner lists the registered tasks
        assert "tasks.restock." not in out and "restock" not in out.split("[tasks]")[0]
    finally:
        worker.stop()


def _cli(db: Database, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "tasks", *args], db.env(**extra), ROOT, 120)


def test_status_and_jobs_show_only_the_wings_that_are_on(
        databases: Callable[[str], Database]) -> None:
    """`status` leaves out the section of a wing that is off (its tables may not exist) and
    says so in one line when asked for it; `jobs` with the ranges wing off refuses likewise."""
    db = databases("sqlite")
    assert db.migrate(WINGS="restock").returncode == 0
    shown = _cli(db, "status", "--json", WINGS="restock")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["item"]["sections"] == ["restock", "letters", "queues"]
    asked = _cli(db, "status", "--section", "ranges", WINGS="restock")
    assert asked.returncode == 1
    assert asked.stderr.strip() == ("status: the ranges wing is off (WINGS), so it has no "
                                    "section to show")
    refused = _cli(db, "jobs", "runs", "cm_data", WINGS="restock")
    assert refused.returncode == 1 and "the ranges wing is off (WINGS)" in refused.stderr
    assert "Traceback" not in refused.stderr + asked.stderr

    other = databases("sqlite")
    assert other.migrate(WINGS=NO_RESTOCK).returncode == 0
    shown = _cli(other, "status", "--json", WINGS=NO_RESTOCK)
    assert shown.returncode == 0, shown.stderr
    item = json.loads(shown.stdout)["item"]
    assert item["sections"] == ["ranges", "letters", "queues"] and "restock_nodes" not in item
    text_out = _cli(other, "status", WINGS=NO_RESTOCK)
    assert text_out.returncode == 0 and "never rebuilt" not in text_out.stdout


def test_the_console_hides_and_refuses_the_restock_views_with_restock_off(
        tmp_path: Path) -> None:
    from tests.test_console_http import Browserless, console_env, start_console

    proc, base = start_console(console_env(tmp_path / "c.sqlite", WINGS=NO_RESTOCK))
    try:
        browser = Browserless(base)
        assert browser.login().status == 302
        page = browser.request("/jobs")
        assert page.status == 200 and 'href="/queues"' in page.body
        assert 'href="/restock"' not in page.body
        for path in ("/restock", "/api/restock"):
            answer = browser.request(path)
            assert answer.status == 404, (path, answer.status)
            assert "the restock wing is off (WINGS)" in answer.body
    finally:
        proc.stop()
