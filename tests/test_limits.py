"""MAX_MESSAGE_BYTES (issue 9 item 15): oversized messages are refused on publish and on
receipt, and nothing quotes more than a short prefix of the value."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy.orm import sessionmaker

from tasks.deadletters.store import DeadLetters
from tasks.store.resources import make_engine
from tasks.worker.limits import OVERSIZED_KIND, MessageTooLarge
from tests.support.db import fresh_database
from tests.support.workers import CELERY, ROOT, start_worker

MB = 1024 * 1024


def test_a_one_megabyte_argument_is_refused_on_publish() -> None:
    from tasks.celery import app

    with pytest.raises(MessageTooLarge, match="exceeds MAX_MESSAGE_BYTES") as info:
        app.send_task("tasks.health.ping", ["x" * MB])
    assert len(str(info.value)) < 400


def test_celery_call_refuses_an_oversized_argument_with_a_clear_message(
    worker_env: dict[str, str]
) -> None:
    # One command-line argument is limited to 128 KiB by Linux: a 100 KB id over a 64 KiB limit.
    env = dict(worker_env, MAX_MESSAGE_BYTES="65536")
    run = subprocess.run([*CELERY, "call", "tasks.health.ping", "--args",
                          json.dumps(["x" * 100_000])], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "message of 100,0" in run.stderr and "exceeds MAX_MESSAGE_BYTES (65,536)" in run.stderr
    assert len(run.stdout + run.stderr) < 10_000


@pytest.mark.timeout(120)
def test_a_worker_refuses_an_oversized_message_from_another_producer(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    fresh_database(worker_env["DATABASE_URL"]).dispose()
    worker = start_worker(worker_env, 1)
    # A producer without the platform's limit (another service, an older client).
    foreign = Celery(broker=worker_env["REDIS_URL"], backend=worker_env["REDIS_URL"],
                     set_as_current=False)
    try:
        result = foreign.send_task("tasks.health.ping", ["y" * MB])
        result.get(timeout=60, propagate=False)
        assert result.state == "FAILURE"
        assert "exceeds MAX_MESSAGE_BYTES" in str(result.result)
        assert len(str(result.result)) < 400
        assert foreign.send_task("tasks.health.ping").get(timeout=60)["status"] == "ok"
        log = worker.output()
    finally:
        foreign.close()
        worker.stop()
    assert "refused task tasks.health.ping" in log
    assert max(len(line) for line in log.splitlines()) < 2000
    engine = make_engine(worker_env["DATABASE_URL"])
    letters = DeadLetters(sessionmaker(engine)).list(OVERSIZED_KIND)
    engine.dispose()
    assert [x.ref for x in letters] == [result.id]
    assert letters[0].payload["bytes"] > MB and len(json.dumps(letters[0].payload)) < 400


@pytest.mark.timeout(120)
def test_a_large_value_in_a_failure_is_cut_in_the_result_and_the_log(
    worker_env: dict[str, str]
) -> None:
    import redis

    fresh_database(worker_env["DATABASE_URL"]).dispose()
    worker = start_worker(worker_env, 1)
    big = "z" * 200_000  # under MAX_MESSAGE_BYTES: allowed through, echoed by the exception
    sender = Celery(broker=worker_env["REDIS_URL"], backend=worker_env["REDIS_URL"],
                    set_as_current=False)
    try:
        result = sender.send_task("devtools.samples.picky", [big])
        result.get(timeout=60, propagate=False)
        assert result.state == "FAILURE" and isinstance(result.result, ValueError)
        client = redis.Redis.from_url(worker_env["REDIS_URL"])
        stored = client.get(f"celery-task-meta-{result.id}")
        client.close()
        # the pool process stores the result before its log line reaches the worker's log
        worker.wait_for("ValueError", timeout=30)
        log = worker.output()
    finally:
        sender.close()
        worker.stop()
    assert stored is not None and len(stored) < 20_000, len(stored or b"")
    meta = json.loads(stored)
    assert meta["status"] == "FAILURE" and meta["name"] == "devtools.samples.picky"
    assert "zzzz" in meta["args"][0] and len(meta["args"][0]) < 200
    assert "is malformed" not in meta["result"]["exc_message"][0]  # cut before the end
    assert "ValueError" in log
    assert max(len(line) for line in log.splitlines()) < 2100
