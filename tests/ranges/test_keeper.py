"""A worker keeps the runner messages it holds counted and lets them go when it lets go of them
(tasks/ranges/keeper.py). The nemesis found the hole: four runner messages failed before their
bodies ran (Celery fails a task whose STARTED write raises, and acks it), their tokens counted
for RANGE_RUNNER_WAIT (600 s), and the job ran with no runner at all."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery

from examples.seed import seed_cm_data
from tasks.ranges import keeper
from tasks.ranges.keeper import RUN_PARTITION, failed, held_tokens
from tasks.ranges.keys import range_runners_key
from tasks.ranges.runners import RunnerSlots, new_token
from tests.ranges.cluster import Platform
from tests.support.ports import free_port
from tests.support.workers import start_worker, wait_until

LONG, ALIVE = 600.0, 4.5


@dataclass(eq=False)
class Req:
    """What the keeper reads of a Celery request (the real ones are made by a worker)."""

    name: str
    args: Any


def _slots(client: redis.Redis) -> RunnerSlots:
    return RunnerSlots(client, "cm_data", 4, wait=LONG, alive=ALIVE)


def _left(client: redis.Redis, token: str) -> float | None:
    """Seconds the token still counts (server clock), None if it no longer counts (gone, or
    its score passed: the set drops those only when a script next runs on it)."""
    score = client.zscore(range_runners_key("cm_data"), token)
    if score is None:
        return None
    sec, usec = client.time()
    left = score / 1000 - (sec + usec / 1e6)
    return left if left > 0 else None


def test_held_tokens_shorten_counting_ones_and_never_bring_an_ended_one_back(
        redis_client: redis.Redis) -> None:
    slots = _slots(redis_client)
    sent, ended = new_token(), new_token()
    slots.sent([sent, ended])
    slots.ended(ended)
    assert (_left(redis_client, sent) or 0) > LONG - 5
    assert slots.held([sent, ended, new_token()]) == 1
    left = _left(redis_client, sent)
    assert left is not None and 0 < left <= ALIVE
    assert _left(redis_client, ended) is None
    assert slots.outstanding() == 1


def test_the_tokens_of_held_requests_and_failed_tasks_are_collected_by_job() -> None:
    requests = [Req(name=RUN_PARTITION, args=["cm_data", None, "ab12"]),
                Req(name=RUN_PARTITION, args=["cm_data", 3]),  # no runner token
                Req(name="tasks.health.ping", args=["x", None, "cd34"]),
                Req(name=RUN_PARTITION, args="not a list")]
    gone = Req(name=RUN_PARTITION, args=["cm_data", None, "0a0b"])
    failed(Req(name=RUN_PARTITION, args=["other", None, "ef56"]))
    failed(Req(name=RUN_PARTITION, args=("cm_data", 1)))  # no token to count out
    failed(gone)  # Celery may keep a failed request: it is counted out, never held again
    try:
        assert held_tokens([*requests, gone]) == {"cm_data": {"ab12", "0a0b"},
                                                  "other": {"ef56"}}
        keeper._failed.clear()  # a good tick: the failed tokens were marked once
        assert held_tokens([*requests, gone]) == {"cm_data": {"ab12"}}
    finally:
        keeper._failed.clear()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("db_kind", ["sqlite"], indirect=True)
def test_a_runner_that_fails_before_its_body_stops_counting_within_seconds(
        engine: object, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 100)  # type: ignore[arg-type]
    # A result backend nobody answers: the STARTED write fails, so the task fails outside its
    # body and its message is acked, as in the nemesis run behind a black-holed Redis.
    cluster = platform(RESULT_BACKEND=f"redis://127.0.0.1:{free_port()}/0", LEASE_TTL="1.5")
    # On `ranges` alone: the control queue's tasks would meet the dead backend first.
    worker = start_worker(cluster.env, 1, "keeper", "-Q", "ranges")
    cluster.procs.append(worker)
    client = redis.Redis.from_url(cluster.redis_server.url)
    try:
        token = new_token()
        _slots(client).sent([token])
        assert (_left(client, token) or 0) > LONG - 5
        # Sent as the reconciler sends it; `celery call` would wait on the dead backend.
        sender = Celery("send", broker=cluster.redis_server.url, set_as_current=False)
        sender.send_task(RUN_PARTITION, args=["cm_data", None, token], queue="ranges",
                         serializer="json")
        sender.close()
        asked = time.monotonic()
        # The worker's main process counts it out: the token stops counting 3 TTLs (4.5 s)
        # after the task failed, not RANGE_RUNNER_WAIT (600 s) after it was sent.
        wait_until(lambda: _left(client, token) is None, 60,
                   f"the failed runner's token gone (worker log {worker.log})")
        assert time.monotonic() - asked < 60
    finally:
        client.close()
