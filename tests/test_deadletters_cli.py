"""`python -m tasks deadletters list | show | replay | purge`, run as an operator runs them
(issue 11): a real poison message on a real prefork worker is capped, replayed and capped
again; bad ids and durations are refused with a clear line and change nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import sessionmaker

from tasks.config.envparse import parse_duration, spoken_duration
from tasks.deadletters.store import (
    AlreadyReplayed,
    DeadLetters,
    LetterNotFound,
    redact_payload,
    replay_refusal,
)
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.store.db import utcnow
from tasks.store.resources import make_engine
from tasks.worker.base import DEAD_LETTERED
from tests.support import forkcli
from tests.support.workers import ROOT, start_worker


def letters_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "tasks", "deadletters", *args], env, ROOT, 120)


@pytest.fixture
def migrated(worker_env: dict[str, str]) -> Any:
    from tests.support.db import fresh_database

    engine = fresh_database(worker_env["DATABASE_URL"])
    yield worker_env, engine
    engine.dispose()


def _add(engine: Engine, kind: str, ref: str, payload: dict[str, Any],
         age: timedelta = timedelta(0)) -> int:
    with engine.begin() as conn:
        result = conn.execute(insert(DEAD_LETTERS).values(
            kind=kind, ref=ref, reason=f"{kind} failed for good", payload=json.dumps(payload),
            created_at=utcnow() - age))
        letter_id: int = result.inserted_primary_key[0]  # type: ignore[index]
        return letter_id


def _rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(DEAD_LETTERS).order_by(DEAD_LETTERS.c.id))]


def test_list_filters_by_kind_and_prints_json_and_show_hides_credentials(migrated: Any) -> None:
    env, engine = migrated
    task = _add(engine, "task", "t-1", {"task": "devtools.samples.nap", "args": [1],
                                        "kwargs": {"dsn": "postgresql://app:hunter2@db/x",
                                                   "api_key": "k-123"}})
    part = _add(engine, "range-partition", "cm_data:3", {"job": "cm_data", "part": 3})
    table = letters_cli(env, "list")
    assert table.returncode == 0, table.stderr
    assert "t-1" in table.stdout and "cm_data:3" in table.stdout
    listed = json.loads(letters_cli(env, "list", "--kind", "task", "--json").stdout)
    assert (listed["version"], listed["kind"]) == (1, "dead_letter")
    assert [x["id"] for x in listed["items"]] == [task]
    assert listed["items"][0]["replay_task_id"] is None
    assert listed["items"][0]["created_at"].endswith("Z")
    assert len(json.loads(letters_cli(env, "list", "--json", "--limit", "1").stdout)["items"]) == 1
    assert "no dead letters of kind 'nope'" in letters_cli(env, "list", "--kind", "nope").stdout
    shown = letters_cli(env, "show", str(task))
    assert shown.returncode == 0 and "replayable: yes" in shown.stdout
    assert "replayed_at: -" in shown.stdout and re.search(r"created_at: \S+ \S+ UTC", shown.stdout)
    assert "hunter2" not in shown.stdout and "k-123" not in shown.stdout
    assert "postgresql://app:***@db/x" in shown.stdout
    as_json = json.loads(letters_cli(env, "show", str(part), "--json").stdout)
    assert (as_json["version"], as_json["kind"]) == (1, "dead_letter")
    item = as_json["item"]
    assert item["payload"] == {"job": "cm_data", "part": 3} and not item["replayable"]


def test_show_bounds_a_large_payload(migrated: Any) -> None:
    env, engine = migrated
    big = _add(engine, "task", "big", {"task": "x", "args": ["a" * 50_000], "kwargs": {}})
    shown = letters_cli(env, "show", str(big))
    assert shown.returncode == 0 and "characters, cut" in shown.stdout
    assert len(shown.stdout) < 6000


def test_a_letter_without_a_task_and_arguments_is_not_replayed(migrated: Any) -> None:
    env, engine = migrated
    part = _add(engine, "range-partition", "cm_data:3", {"job": "cm_data", "part": 3})
    oversized = _add(engine, "oversized-message", "t-9", {"task": "x", "bytes": 9, "prefix": ""})
    before = _rows(engine)
    refused = letters_cli(env, "replay", str(part))
    assert refused.returncode == 1
    assert f"dead letter {part} (range-partition) is not replayable" in refused.stderr
    assert "tasks.ranges.start" in refused.stderr  # what to do instead
    refused = letters_cli(env, "replay", str(oversized))
    assert refused.returncode == 1 and "keeps no task arguments" in refused.stderr
    assert _rows(engine) == before


def test_bad_ids_and_durations_are_refused_and_change_nothing(migrated: Any) -> None:
    env, engine = migrated
    _add(engine, "task", "t-1", {"task": "x", "args": [], "kwargs": {}}, timedelta(days=9))
    before = _rows(engine)
    for args in (["show", "99"], ["replay", "99"], ["purge", "99"]):
        run = letters_cli(env, *args)
        assert run.returncode == 1 and "no dead letter with id 99" in run.stderr, args
    for args in (["show", "abc"], ["replay", "1.5"], ["purge", "0"]):
        run = letters_cli(env, *args)
        assert run.returncode == 2 and "Invalid value" in run.stderr, args
    for bad in ("7x", "-1d", "0h", "d", "7 days"):
        run = letters_cli(env, "purge", "--older-than", bad)
        assert run.returncode == 2 and "is not a duration" in run.stderr, bad
    for args in (["purge"], ["purge", "1", "--older-than", "1d"]):
        run = letters_cli(env, *args)
        assert run.returncode == 2 and "give either ID or --older-than" in run.stderr, args
    assert _rows(engine) == before


def test_purge_by_id_and_by_age(migrated: Any) -> None:
    env, engine = migrated
    old = [_add(engine, "task", f"old-{i}", {"task": "x"}, timedelta(hours=13)) for i in range(3)]
    newer = _add(engine, "task", "newer", {"task": "x"}, timedelta(hours=11))
    fresh = _add(engine, "task", "fresh", {"task": "x"})
    run = letters_cli(env, "purge", "--older-than", "12h")
    assert run.returncode == 0 and "purged 3 dead letters" in run.stdout, run.stderr
    assert [r[0] for r in _rows(engine)] == [newer, fresh]
    assert letters_cli(env, "purge", str(newer)).stdout.strip() == f"purged dead letter {newer}"
    assert [r[0] for r in _rows(engine)] == [fresh]
    assert letters_cli(env, "purge", str(old[0])).returncode == 1  # already gone


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("45s", 45), ("1.5h", 5400),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(spoken_duration(seconds)) == seconds


def test_every_replay_hint_names_a_kind_the_platform_writes() -> None:
    """The hints are the registered kinds' (the wings declare theirs, the app registers them);
    each is a kind a wing or the core really dead-letters with."""
    import tasks.celery  # noqa: F401  (registers the wings' kinds)
    from tasks.deadletters.kinds import kinds
    from tasks.ranges.workrow import DEAD_LETTER_KIND as RANGE_KIND
    from tasks.restock.drain import DEAD_LETTER_KIND as RESTOCK_KIND
    from tasks.restock.maintenance import REBUILD_DEAD_LETTER_KIND
    from tasks.worker.limits import OVERSIZED_KIND

    assert {name for name, kind in kinds().items() if kind.hint} == {
        RANGE_KIND, RESTOCK_KIND, REBUILD_DEAD_LETTER_KIND, OVERSIZED_KIND, "compensation"}


def test_replay_refusals_and_redaction_are_pure() -> None:
    assert replay_refusal({"task": "t", "args": [1], "kwargs": {}}) is None
    assert replay_refusal({"job": "cm_data"}) == "it keeps no task name"
    assert "no task arguments" in str(replay_refusal({"task": "t", "args": "x", "kwargs": {}}))
    assert redact_payload({"a": ["redis://:pw@h/0"], "Password": 1}) == {
        "a": ["redis://:***@h/0"], "Password": "***"}


@pytest.mark.timeout(240)
def test_a_replayed_poison_message_is_capped_again_and_replayed_once(migrated: Any) -> None:
    env, engine = migrated
    env = dict(env, REDELIVERY_CAP="2")
    key = uuid.uuid4().hex
    client = redis.Redis.from_url(env["REDIS_URL"])
    app = Celery(broker=env["REDIS_URL"], backend=env["REDIS_URL"], set_as_current=False)
    letters = DeadLetters(sessionmaker(engine))
    worker = start_worker(env, 1)
    try:
        first = app.send_task("devtools.samples.poison", [key])
        _wait_dead(first, worker)
        [letter] = letters.list("task")
        assert letter.ref == first.id and letter.payload["args"] == [key]
        replayed = letters_cli(env, "replay", str(letter.id))
        assert replayed.returncode == 0, replayed.stderr
        new_id = replayed.stdout.strip().rsplit(" ", 1)[-1]
        assert new_id != first.id and "devtools.samples.poison sent as task" in replayed.stdout
        _wait_dead(app.AsyncResult(new_id), worker)
        again = letters_cli(env, "replay", str(letter.id))
        assert again.returncode == 1 and "already replayed" in again.stderr
        assert new_id in again.stderr
    finally:
        worker.stop()
        app.close()
    capped = letters.list("task")
    assert [(x.ref, x.payload["args"]) for x in capped] == [(first.id, [key]), (new_id, [key])]
    assert capped[0].replay_task_id == new_id and capped[0].replayed_at is not None
    assert capped[1].replay_task_id is None  # the new letter can be replayed in its turn
    assert int(client.get(f"sample:poison:{key}") or 0) == 4  # twice the cap of 2, nothing more
    listed = json.loads(letters_cli(env, "list", "--json").stdout)["items"]
    assert {x["id"]: x["replay_task_id"] for x in listed} == {capped[0].id: new_id,
                                                             capped[1].id: None}


def _wait_dead(result: Any, worker: Any) -> None:
    deadline = time.monotonic() + 100
    while result.state != DEAD_LETTERED:
        assert time.monotonic() < deadline, f"still {result.state}: {worker.output()[-3000:]}"
        time.sleep(0.3)


def test_a_failed_send_takes_the_replay_back(migrated: Any) -> None:
    """The broker does not answer: the replay fails with a clear error, the letter stays
    replayable."""
    env, engine = migrated
    letter = _add(engine, "task", "t-1", {"task": "devtools.samples.nap", "args": [0],
                                          "kwargs": {}})
    dead = dict(env, REDIS_URL="redis://127.0.0.1:1/0")
    run = letters_cli(dead, "replay", str(letter))
    assert run.returncode == 1 and "its task could not be sent" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    with make_engine(env["DATABASE_URL"]).connect() as conn:
        row = conn.execute(select(DEAD_LETTERS).where(DEAD_LETTERS.c.id == letter)).one()
    assert row.replayed_at is None and row.replay_task_id is None


def test_the_store_replays_once_and_purges_on_every_database(engine: Engine) -> None:
    letters = DeadLetters(sessionmaker(engine))
    letter = _add(engine, "task", "t-1", {"task": "x.y", "args": [1, "a"], "kwargs": {"k": 2}})
    sent: list[tuple[Any, ...]] = []

    def broken(*_: Any) -> None:
        raise ConnectionError("broker away")

    with pytest.raises(ConnectionError):
        letters.replay(letter, broken)
    assert letters.get(letter).replayed_at is None  # the claim was taken back
    done = letters.replay(letter, lambda *a: sent.append(a))
    assert sent == [("x.y", [1, "a"], {"k": 2}, done.task_id)]
    with pytest.raises(AlreadyReplayed, match=done.task_id):
        letters.replay(letter, lambda *a: sent.append(a))
    assert len(sent) == 1 and letters.get(letter).replay_task_id == done.task_id
    letters.purge(letter)
    with pytest.raises(LetterNotFound):
        letters.purge(letter)
    assert letters.counts() == {}
