"""Dead letters have a retention, and `status` counts them in SQL (issue 9 item 12)."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from datetime import timedelta
from io import StringIO

import pytest
from rich.console import Console
from sqlalchemy import Engine, event, insert
from sqlalchemy.orm import sessionmaker

from tasks.cli.render import letters_renderable
from tasks.deadletters.store import PRUNE_BATCH, DeadLetters
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.deadletters.view import letters_view
from tasks.restock.status import _letters_per_shard, shard_views
from tasks.store.db import utcnow
from tasks.wings import WINGS, load_settings
from tasks.worker.schedule import beat_schedule


def _letters(engine: Engine, n: int, age_days: float, kind: str = "task",
             node: int | None = None) -> None:
    created = utcnow() - timedelta(days=age_days)
    payload = json.dumps({"node": node, "queue": "q0", "entry": '"node": 9, "queue"'}
                         if node is not None else {"task": "x"}, sort_keys=True)
    with engine.begin() as conn:
        conn.execute(insert(DEAD_LETTERS), [
            {"kind": kind, "ref": f"r{i}", "reason": "boom", "payload": payload,
             "created_at": created} for i in range(n)])


def test_prune_deletes_only_letters_past_the_retention(engine: Engine) -> None:
    letters = DeadLetters(sessionmaker(engine))
    _letters(engine, PRUNE_BATCH + 5, age_days=40)  # more than one batch
    _letters(engine, 3, age_days=1)
    assert letters.prune(retention=30 * 86400) == PRUNE_BATCH + 5
    assert letters.counts() == {"task": 3}
    assert letters.prune(retention=30 * 86400) == 0  # idempotent


@pytest.mark.parametrize("db_kind", ["sqlite"], indirect=True)
def test_a_write_committed_between_the_prune_s_read_and_its_delete_does_not_fail_it(
    engine: Engine,
) -> None:
    """SQLite under WAL: a transaction that read, then writes after another connection
    committed, fails at once with "database is locked" (its snapshot is stale; the busy
    timeout does not help). A prune batch reads the ids past the retention, then deletes
    them: a letter added between the two failed the prune. It takes SQLite's write lock up
    front, so the other writer waits for it instead."""
    letters = DeadLetters(sessionmaker(engine))
    _letters(engine, 3, age_days=40)
    wrote = threading.Event()
    started: list[threading.Thread] = []

    def other_writer() -> None:
        _letters(engine, 1, age_days=0)
        wrote.set()

    @event.listens_for(engine, "after_cursor_execute")
    def _another_write_between(_c: object, _cur: object, statement: str, *_: object) -> None:
        if statement.startswith("SELECT dead_letters.id") and not started:  # the batch's read
            started.append(threading.Thread(target=other_writer))
            started[0].start()
            wrote.wait(1.0)  # lands at once unless the prune holds the write lock

    assert letters.prune(retention=30 * 86400) == 3
    assert started, "the prune's read was not seen"
    started[0].join(30)
    assert wrote.is_set(), "the other writer never got the lock"
    assert letters.counts() == {"task": 1}


def test_the_prune_is_scheduled_and_its_retention_is_a_setting() -> None:
    entry = beat_schedule(load_settings({}), WINGS)["prune-dead-letters"]
    assert entry["task"] == "tasks.health.prune_dead_letters"
    assert load_settings({"DEAD_LETTER_RETENTION": "86400"}).dead_letter_retention == 86400
    assert load_settings({}).dead_letter_retention == 30 * 86400
    with pytest.raises(ValueError, match="DEAD_LETTER_RETENTION"):
        load_settings({"DEAD_LETTER_RETENTION": "0"})


def test_the_prune_task_runs_with_the_configured_retention(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.store.resources import Resources
    from tasks.worker import health

    _letters(engine, 4, age_days=2)
    _letters(engine, 2, age_days=0)
    settings = health.app.platform_settings
    res = Resources(settings)
    res._sessions = sessionmaker(engine)  # the test's database, not the default file
    monkeypatch.setattr(health, "resources_for", lambda _settings: res)
    # The task reads the settings of its app (tasks.config.settings.settings_of).
    monkeypatch.setattr(health.app, "platform_settings", dataclasses.replace(
        settings, dead_letter_retention=86400.0))
    assert health.prune_dead_letters.apply().get() == 4
    assert DeadLetters(sessionmaker(engine)).counts() == {"task": 2}


def test_status_counts_letters_in_sql_and_lists_recent_ones_without_payloads(
    engine: Engine,
) -> None:
    sessions = sessionmaker(engine)
    _letters(engine, 3, age_days=0, kind="restock", node=0)
    _letters(engine, 2, age_days=0, kind="restock", node=1)
    _letters(engine, 1, age_days=0, kind="restock", node=10)
    _letters(engine, 25, age_days=0)
    payload_reads: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _spy(_c: object, _cur: object, statement: str, *_: object) -> None:
        if re.search(r"dead_letters\.payload\s*(,|FROM)", statement):  # read as a column
            payload_reads.append(statement)

    assert _letters_per_shard(sessions, [0, 1, 2, 10]) == {0: 3, 1: 2, 2: 0, 10: 1}
    assert shard_views(sessions, [], [], 0) == []
    out = StringIO()
    Console(file=out, width=200).print(letters_renderable(letters_view(sessions)))
    shown = out.getvalue()
    assert "dead letters: 31 (restock: 6, task: 25)" in shown
    assert "newest 10 dead letters" in shown and shown.count(" boom ") == 10
    assert payload_reads == []
