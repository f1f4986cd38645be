"""The rollback task never compensates a live saga (issue 18 item 3), on real prefork workers.

`tasks.rollback.rollback` is sent by the worker on `task_revoked(terminated=True)` and by an
operator's `celery call`. Celery announces `terminated=True` once it has sent the signal,
whether or not the pool process died: with REMAP_SIGTERM=SIGQUIT (a documented Celery option)
pool processes ignore SIGTERM, revoke's default signal. The rollback task must act only where
the sweeper would (journal lease gone, owners row taken over by compare-and-set), so a saga is
either completed once or compensated once, never both, and its state agrees with its ledger.

Each saga waits at a gate (`tests.support.sagas.gated_saga`) until the test has seen what the
rollback task did, so no test races the saga it controls. No sweeper runs here: whatever is
compensated, the rollback task did it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from celery.result import AsyncResult

from tests.rollback.platform import Platform, outcome, pool_children, undone_once
from tests.support.sagas import gate_key
from tests.support.workers import celery_call, wait_until

pytestmark = pytest.mark.timeout(120)

DONE = ["reserve_stock", "charge", "ship"]
UNDONE = ["reserve_stock", "charge", "refund", "release_stock"]


def _start(platform: Platform, order: str) -> tuple[AsyncResult, int]:
    """Send a gated saga; once it has charged, return it and the pid of its pool process."""
    result = platform.client.send_task("tests.support.sagas.gated_saga", args=[order, 90])
    wait_until(lambda: "charge" in platform.ledger(order), 30, "the saga to charge")
    return result, wait_until(lambda: _pid_of(platform, result.id), 15, "the saga's process")


def _pid_of(platform: Platform, task_id: str) -> int | None:
    """The pool process running `task_id`, as `celery inspect active` reports it."""
    active = platform.client.control.inspect(timeout=2.0).active() or {}
    for tasks in active.values():
        for task in tasks:
            if task["id"] == task_id:
                return int(task["worker_pid"])
    return None


def _open_gate(platform: Platform, order: str) -> None:
    platform.redis.set(gate_key(order), "1", ex=120)


def _status(platform: Platform, task_id: str) -> str:
    """The task's state in the result backend now. An AsyncResult keeps the first ready state
    it saw (REVOKED, stored when the signal was sent), so it is read from the backend."""
    raw = platform.redis.get(f"celery-task-meta-{task_id}")
    return str(json.loads(raw)["status"]) if raw else "PENDING"


def _alive(pid: int) -> bool:
    """True if process `pid` exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _rollback_results(platform: Platform, task_id: str) -> list[dict[str, Any]]:
    """What the finished rollback tasks of `task_id` returned (read from the result backend,
    since the worker sent them under ids of its own)."""
    found = []
    for key in platform.redis.scan_iter(match="celery-task-meta-*"):
        raw = platform.redis.get(key)
        meta = json.loads(raw) if raw else {}
        value = meta.get("result")
        if (meta.get("status") == "SUCCESS" and isinstance(value, dict)
                and value.get("task_id") == task_id):
            found.append(value)
    return found


def _agrees(platform: Platform, order: str, task_id: str) -> None:
    """Completed once or compensated once, never both, and the stored state says which."""
    entries = platform.ledger(order)
    state = _status(platform, task_id)
    if state == "SUCCESS":
        assert entries == DONE, entries
    else:
        assert entries == UNDONE, (state, entries)
    assert platform.states() in ([], [("reserve_stock", "compensated"),
                                      ("charge", "compensated")])


def test_revoke_terminate_of_a_saga_that_ignores_sigterm_leaves_it_to_complete_once(
    platform: Platform
) -> None:
    platform.env["REMAP_SIGTERM"] = "SIGQUIT"
    worker = platform.worker("remapped", concurrency=2)  # a free process for the rollback task
    order = "o-remap-term"
    result, child = _start(platform, order)
    platform.client.control.revoke(result.id, terminate=True)  # SIGTERM: ignored by the pool
    wait_until(lambda: _rollback_results(platform, result.id)
               or "refund" in platform.ledger(order), 30, "the rollback task's verdict")
    assert platform.ledger(order) == ["reserve_stock", "charge"]  # nothing undone while alive
    [verdict] = _rollback_results(platform, result.id)
    assert verdict["outcome"] == "owner_alive" and verdict["compensated"] == [], verdict
    assert _alive(child) and child in pool_children(worker.pid)  # alive all along
    _open_gate(platform, order)
    wait_until(lambda: _status(platform, result.id) in ("SUCCESS", "FAILURE"), 30,
               "the saga to finish")
    assert _status(platform, result.id) == "SUCCESS"
    _agrees(platform, order, result.id)
    assert platform.states() == [] and platform.owners() == []


def test_revoke_terminate_that_kills_the_saga_compensates_it_once(platform: Platform) -> None:
    platform.env["REMAP_SIGTERM"] = "SIGQUIT"
    platform.worker("remapped-quit", concurrency=2)
    order = "o-remap-quit"
    result, child = _start(platform, order)
    # Under REMAP_SIGTERM, SIGQUIT is what ends a pool process; its journal lease lapses
    # unrenewed and only then does the rollback task take the journal over.
    platform.client.control.revoke(result.id, terminate=True, signal="SIGQUIT")
    wait_until(lambda: _rollback_results(platform, result.id), 30, "the rollback task")
    [verdict] = _rollback_results(platform, result.id)
    assert verdict["outcome"] == "rolled_back" and verdict["compensated"] == [2, 1], verdict
    assert not _alive(child)  # the saga's process did die
    _open_gate(platform, order)  # too late: nobody ships
    assert undone_once(platform, order)
    time.sleep(1.0)  # had the saga lived, it would have shipped by now
    assert _status(platform, result.id) == "REVOKED"
    _agrees(platform, order, result.id)
    assert platform.owners() == [(result.id, "taken_over")]


def test_an_operator_rollback_of_a_live_saga_compensates_nothing(platform: Platform) -> None:
    platform.worker("operated", concurrency=2)
    order = "o-operator"
    result, _ = _start(platform, order)
    sent = celery_call(platform.env, "tasks.rollback.rollback",
                       "--args", json.dumps([result.id, "operator"]))
    assert sent.returncode == 0, sent.stderr
    verdict = AsyncResult(sent.stdout.strip(), app=platform.client).get(timeout=30)
    assert verdict["outcome"] == "owner_alive" and verdict["compensated"] == [], verdict
    assert platform.ledger(order) == ["reserve_stock", "charge"]
    assert [state for _, state in platform.owners()] == ["running"]
    _open_gate(platform, order)
    assert result.get(timeout=30) == DONE
    _agrees(platform, order, result.id)
    assert platform.states() == [] and platform.owners() == []


def test_an_operator_rollback_takes_a_paused_saga_over_and_fences_it(
    platform: Platform
) -> None:
    platform.worker("paused-op", concurrency=2)
    order = "o-paused-op"
    result, child = _start(platform, order)
    os.kill(child, signal.SIGSTOP)
    try:
        sent = platform.client.send_task("tasks.rollback.rollback", args=[result.id, "op"])
        verdict = sent.get(timeout=30)  # it waits for the lease to lapse, then takes over
        assert verdict["outcome"] == "rolled_back" and verdict["compensated"] == [2, 1]
        assert undone_once(platform, order)
        _open_gate(platform, order)
    finally:
        os.kill(child, signal.SIGCONT)
    wait_until(lambda: result.ready(), 30, "the paused saga to finish")
    assert outcome(result) == "FAILURE JournalLost", result.traceback
    _agrees(platform, order, result.id)  # it shipped nothing after the takeover
    assert platform.owners() == [(result.id, "taken_over")]


def test_a_duplicate_delivery_that_hits_its_soft_limit_undoes_nothing_of_the_live_one(
    platform: Platform
) -> None:
    # A second delivery of the same task (visibility timeout, a resend) waits for the journal
    # lease the live first one holds; its soft time limit fires while it waits. Its rollback
    # on the soft limit must not undo the first delivery's steps: the journal is not its own.
    platform.worker("duplicated", concurrency=2)
    order = "o-duplicate"
    result, _ = _start(platform, order)
    duplicate = platform.client.send_task("tests.support.sagas.gated_saga", args=[order, 90],
                                          task_id=result.id, soft_time_limit=0.5)
    worker = platform.procs[-1]
    wait_until(lambda: "SoftTimeLimitExceeded" in worker.output(), 30,
               "the duplicate's soft time limit")
    assert platform.ledger(order) == ["reserve_stock", "charge"]
    _open_gate(platform, order)
    wait_until(lambda: _status(platform, result.id) == "SUCCESS", 30,
               "the first delivery to succeed")
    assert duplicate.id == result.id
    _agrees(platform, order, result.id)
