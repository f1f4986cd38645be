"""The restock feature on real processes: a prefork worker and beat doing the whole flow, bad
arguments through Celery, and a drainer SIGKILLed in the middle of a batch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine

from tasks.restock.drain import DrainOutcome
from tasks.restock.tables import ItemState
from tests.restock.conftest import DELAY_MS, World
from tests.support.redis_server import RedisServer
from tests.support.workers import (
    ROOT,
    Proc,
    celery_call,
    platform_env,
    start_worker,
    stop_all,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def platform(
    restock_engine: Engine, two_nodes: list[RedisServer], private_redis: RedisServer
) -> Iterator[dict[str, Any]]:
    env = platform_env(
        REDIS_URL=private_redis.url,
        DATABASE_URL=restock_engine.url.render_as_string(False),
        RESTOCK_REDIS_URLS=",".join(s.url for s in two_nodes),
        RESTOCK_DELAY="2", RESTOCK_INTERVAL="0.5", RESTOCK_BATCH="3", LEASE_TTL="1.5",
        COLUMNS="200",
    )
    client = Celery(broker=private_redis.url, backend=private_redis.url)
    client.conf.update(task_serializer="json", accept_content=["json"],
                       result_accept_content=["json"])
    procs: list[Proc] = []
    yield {"env": env, "client": client, "procs": procs, "nodes": two_nodes}
    stop_all(procs)
    client.close()


def call(client: Celery, task: str, *args: Any, **kwargs: Any) -> Any:
    return client.send_task(task, args=args, kwargs=kwargs).get(timeout=30)


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_worker_and_beat_return_unpaid_stock_and_keep_paid_stock_sold(
    platform: dict[str, Any], restock_engine: Engine
) -> None:
    env, client, procs = platform["env"], platform["client"], platform["procs"]
    procs.append(start_worker(env, 2, "restock"))
    for sku, total in (("sku-a", 10), ("sku-d", 6)):
        assert call(client, "tasks.restock.define_sku", sku, total)["sku_id"] == sku
    items = call(client, "tasks.restock.place_order", "o-1", "m-1",
                 [["i-1", "sku-a", 4], ["i-2", "sku-d", 5]])
    assert [i["state"] for i in items] == [ItemState.HELD, ItemState.HELD]
    call(client, "tasks.restock.place_order", "o-2", "m-4", [["i-3", "sku-a", 3]])
    assert [i["state"] for i in call(client, "tasks.restock.pay", "o-2")] == [ItemState.PAID]
    view = call(client, "tasks.restock.inspect", "sku-a")
    assert (view["redis_stock"], view["consistent"]) == (3, True)
    beat = Proc([sys.executable, "-m", "celery", "-A", "tasks", "beat", "--loglevel=INFO",
                 "-s", f"/tmp/beat-{id(platform)}"], env, "beat")
    procs.append(beat)

    def restocked() -> bool:
        a = call(client, "tasks.restock.inspect", "sku-a")
        d = call(client, "tasks.restock.inspect", "sku-d")
        return bool(a["redis_stock"] == 7 and d["redis_stock"] == 6)

    wait_until(restocked, 40, "beat's sync and drain to return o-1's stock")
    with pytest.raises(Exception, match="not paid in time"):
        call(client, "tasks.restock.pay", "o-1")
    status = subprocess.run([sys.executable, "-m", "tasks", "status"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "restock shards" in status.stdout and "next in" in status.stdout
    forced = call(client, "tasks.restock.rebuild", 0, force=True)
    assert forced["outcome"] == "rebuilt" and forced["term"] >= 2  # beat rebuilt it first
    assert call(client, "tasks.restock.inspect", "sku-a")["redis_stock"] == 7


BAD_CALLS = [
    # An order's lines are checked once (tasks.restock.orders): InvalidOrder, which is an
    # InvalidArguments too.
    ("tasks.restock.place_order", ["o-1", "m-1", [["i-1", "sku-a", -1]]], "InvalidOrder"),
    ("tasks.restock.place_order", ["o-1", "m-1", [["i-1", "sku-a", 2**40]]], "InvalidOrder"),
    ("tasks.restock.place_order", ["o-1", "m-1", "i-1"], "InvalidOrder"),
    ("tasks.restock.place_order", ["o-1", "m-1", [["i:1", "sku-a", 1]]], "InvalidOrder"),
    ("tasks.restock.place_order", ["o-1", "m-1", [["i-1", "sku-zz", 1]]], "UnknownSku"),
    ("tasks.restock.place_order", ["o-1", "m-1", [["i-1", "sku-a", 1], ["i-1", "sku-a", 1]]],
     "DuplicateOrderItem"),
    ("tasks.restock.pay", ["o-404"], "UnknownOrder"),
    ("tasks.restock.drain", [16, "q0"], "InvalidArguments"),
    ("tasks.restock.sync", [0, "q9"], "InvalidArguments"),
    ("tasks.restock.rebuild", ["0"], "InvalidArguments"),
    ("tasks.restock.define_sku", ["sku-b", -5], "InvalidArguments"),
]


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_bad_arguments_fail_clearly_and_change_nothing(platform: dict[str, Any]) -> None:
    env, client, procs = platform["env"], platform["client"], platform["procs"]
    procs.append(start_worker(env, 1, "bad"))
    call(client, "tasks.restock.define_sku", "sku-a", 5)
    for task, args, error in BAD_CALLS:
        result = client.send_task(task, args=args)
        with pytest.raises(Exception) as caught:
            result.get(timeout=30)
        assert type(caught.value).__name__ == error, (task, args, repr(caught.value))
    assert call(client, "tasks.restock.inspect", "sku-a")["redis_stock"] == 5
    with pytest.raises(Exception, match="UNKNOWN_SKU"):
        call(client, "tasks.restock.inspect", "sku-b")


LONG_ID = "o" * 200  # longer than its String(128) column: a raw DataError on PostgreSQL before
HUGE = "x" * 100_000  # as much as one command-line argument may carry
SIZE_CALLS = [  # (task, args, the argument the error must name); the first four via `celery call`
    ("tasks.restock.place_order", [LONG_ID, "m-1", [["i-1", "sku-a", 1]]], "order_id"),
    ("tasks.restock.define_sku", [HUGE, 5], "sku_id"),
    ("tasks.restock.place_order", ["o-1", "m-1", [["i-1", "sku-a", 2**31]]], "qty"),
    ("tasks.restock.drain", [10**30, "q0"], "shard"),
    ("tasks.restock.place_order", ["o-1", HUGE, [["i-1", "sku-a", 1]]], "member_id"),
    ("tasks.restock.place_order", ["o-1", "m-1", [[LONG_ID, "sku-a", 1]]], "order_item_id"),
    ("tasks.restock.place_order", ["o-1", "m-1", [["i-1", LONG_ID, 1]]], "sku_id"),
    ("tasks.restock.pay", [LONG_ID], "order_id"),
    ("tasks.restock.inspect", [HUGE], "sku_id"),
    ("tasks.restock.sync", [0, HUGE], "queue"),
    ("tasks.restock.rebuild", [-1], "shard"),
]


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_oversized_ids_and_out_of_range_numbers_fail_clearly_through_celery_call(
    platform: dict[str, Any], private_redis: RedisServer
) -> None:
    env, client, procs = platform["env"], platform["client"], platform["procs"]
    worker = start_worker(env, 1, "sizes")
    procs.append(worker)
    call(client, "tasks.restock.define_sku", "sku-a", 5)
    for n, (task, args, name) in enumerate(SIZE_CALLS):
        if n < 4:
            done = celery_call(env, task, "--args", json.dumps(args))
            assert done.returncode == 0, done.stderr
            task_id = done.stdout.strip().splitlines()[-1]
        else:
            task_id = client.send_task(task, args=args).id
        with pytest.raises(Exception) as caught:
            client.AsyncResult(task_id).get(timeout=30)
        message = str(caught.value)
        # An order's lines fail with InvalidOrder, an InvalidArguments of the order's own.
        assert type(caught.value).__name__ in ("InvalidArguments", "InvalidOrder"), (
            task, name, message[:300])
        assert message.startswith(name) and len(message) < 300, message[:400]
        with redis.Redis.from_url(private_redis.url) as backend:
            stored = backend.get(f"celery-task-meta-{task_id}") or b""
        # The stored error is short (the call's own args are the app's result_extended
        # metadata, kept or not by the app's settings, not by this task).
        assert len(json.dumps(json.loads(stored)["result"])) < 2000, task
    assert call(client, "tasks.restock.inspect", "sku-a")["redis_stock"] == 5
    assert max(len(line) for line in worker.output().splitlines()) < 4000


def test_a_drainer_killed_mid_batch_loses_nothing_and_restocks_once(world: World) -> None:
    world.shop.define_sku("sku-a", 20)
    for i in range(6):
        world.shop.place_order(f"o-{i}", "m-1", [[f"i-{i}", "sku-a", 2]])
    world.shop.pay("o-0")
    world.clock.advance(DELAY_MS + 100)
    world.drainers[0].sync("q0")
    argv = [sys.executable, "-m", "tests.restock.drainer_proc", world.servers[0].url,
            world.sessions.kw["bind"].url.render_as_string(False), "0", "stall", "q0",
            str(world.clock()), "1.5"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=platform_env(), stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("claimed"), line
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert world.stock("sku-a") == 8  # claimed, but not restocked
    assert world.qty("sku-a", ItemState.RELEASED) == 10
    assert world.drainers[0].drain("q0").outcome == DrainOutcome.BUSY  # its lease lives on
    time.sleep(1.6)
    report = world.drainers[0].drain("q0")
    assert report.outcome == DrainOutcome.DRAINED and report.restocked == 5
    assert world.stock("sku-a") == 18
    world.check_conserved()
