"""The randomized fault run (`python -m bench nemesis`): its schedule is a function of the seed,
its fault proxy really cuts, delays and black-holes a real Redis, and a short fixed-seed run on
real workers, beats, Redis and PostgreSQL ends with verdict PASS and every count clean."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine, insert, text

from bench.faultproxy import FaultProxy
from bench.nemesis.check import Findings, check_rows, check_stock
from bench.nemesis.faults import KINDS, WARMUP_S, describe, is_leader, schedule
from bench.nemesis.job import ddl
from bench.nemesis.ledger import judge, valid_ledgers
from tasks.restock.keys import stock_key
from tasks.restock.tables import ORDER_ITEMS, PAYMENTS, SKUS
from tests.support.db import DATABASES
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, platform_env

SEED, DURATION, QUIET = 7, 55, 40


def test_the_schedule_is_a_function_of_the_seed() -> None:
    first, again, other = schedule(SEED, 120, 2.0), schedule(SEED, 120, 2.0), schedule(8, 120, 2.0)
    assert first == again
    assert first != other
    assert first[0].at == WARMUP_S and all(f.at < 120 for f in first)
    gaps = [b.at - a.at for a, b in zip(first, first[1:], strict=False)]
    assert all(2.0 <= gap <= 5.0 for gap in gaps), gaps
    assert set(describe(first)) == set(KINDS)  # a deck: every kind each round
    stops = [f for f in first if f.kind in ("sigstop", "proxy_blackhole")]
    assert stops and all(f.hold > 2.0 for f in stops)  # past the lease TTL


def test_the_checker_accepts_whole_sagas_and_whole_compensations_only() -> None:
    valid = valid_ledgers()
    assert ("reserve_stock", "charge", "ship") in valid
    assert ("reserve_stock", "charge", "refund", "release_stock") in valid
    assert () in valid
    assert ("reserve_stock", "charge") not in valid  # half done
    assert ("reserve_stock", "charge", "refund", "release_stock", "ship") not in valid
    assert ("reserve_stock", "release_stock", "release_stock") not in valid  # undone twice


def test_a_saga_across_a_wipe_is_judged_on_its_history_and_its_surviving_epoch() -> None:
    done, undone = ["reserve_stock", "charge"], ["refund", "release_stock"]
    # The wipe took the effects; the compensation afterwards rightly found nothing to undo.
    assert judge(done, [], compensated=True) is None
    assert judge(["reserve_stock"], ["charge", "refund"], True) is None
    assert judge(["reserve_stock"], ["charge"], True) == "['charge'] not undone after the wipe"
    assert judge([], done, compensated=False) == "half done"
    assert judge(done, ["ship"], compensated=False) is None  # finished after the wipe
    assert judge(done + undone, ["ship"], True) == "ship after the compensation began"
    assert judge(done, ["refund", "refund"], True) == "refund twice"
    # Redelivered after its worker died: the first attempt undone, the second whole.
    assert judge([], [*done, *undone, *done, "ship"], compensated=False) is None
    assert judge([], [*done, *done, "ship"], False) == (
        "an earlier attempt was not undone before the saga ran again")
    assert judge(done, ["cancel_shipment"], True) == "cancel_shipment without ship before it"
    assert judge(done, ["refund"], True) == "['refund'] undone after the wipe took the step"
    assert judge(done, ["ship", "cancel_shipment"], False) == (
        "undone though its journal says it was not rolled back")


def test_a_beat_leads_after_it_became_leader_and_until_it_lost_the_lease() -> None:
    assert is_leader("--- start 1 ---\nbeat: became leader (fence 3)\n")
    assert not is_leader("--- start 1 ---\nbeat: became leader (fence 3)\n"
                         "beat: lost the leader lease; standing by\n")
    assert not is_leader("beat: became leader (fence 3)\n--- start 2 ---\n")


@pytest.fixture
def proxied() -> Iterator[tuple[RedisServer, FaultProxy]]:
    server = RedisServer().start()
    proxy = FaultProxy(free_port(), server.port).start()
    yield server, proxy
    proxy.stop()
    server.kill()


def test_the_fault_proxy_delays_cuts_and_black_holes_real_redis_traffic(
        proxied: tuple[RedisServer, FaultProxy]) -> None:
    _, proxy = proxied
    client = redis.Redis(port=proxy.listen_port, socket_timeout=1)
    assert client.ping()
    proxy.latency(0.2)
    began = time.monotonic()
    client.ping()
    assert time.monotonic() - began >= 0.4  # both ways
    proxy.latency(0)
    assert proxy.cut() == 1
    assert client.ping()  # redis-py reconnects after the reset
    proxy.blackhole(True)
    with pytest.raises(redis.TimeoutError):
        client.ping()
    proxy.blackhole(False)
    assert client.ping()
    client.close()


@pytest.mark.timeout(420)
def test_a_fixed_seed_nemesis_run_passes_with_every_count_clean() -> None:
    env = platform_env()
    run = subprocess.run(
        [sys.executable, "-m", "bench", "nemesis", "--seed", str(SEED), "--duration",
         str(DURATION), "--quiet-timeout", str(QUIET), "--db", DATABASES["postgresql"],
         "--redis-port", str(free_port()), "--proxy-port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    report = run.stdout[-6000:]
    last = (run.stdout.strip().splitlines() or [""])[-1]
    assert last.startswith("{"), f"rc {run.returncode}\n{report}\n{run.stderr[-4000:]}"
    result = json.loads(last)
    assert result["seed"] == SEED and result["duration_s"] == DURATION
    assert result["faults"] == describe(schedule(SEED, DURATION, 2.0)), report
    assert set(result["faults"]) == set(KINDS), report
    assert result["rows_once"] == result["rows_total"] > 0, report
    assert (result["rows_twice"], result["rows_missed"]) == (0, 0), report
    assert result["final_run"] == "succeeded", report
    assert result["skus_inconsistent"] == 0, report
    assert result["orders_restocked_after_payment"] == 0, report
    assert result["sagas"] > 0 and result["sagas_half_done"] == 0, report
    assert result["workers_silent"] == [] and result["quiet"], report
    assert result["time_to_quiescence_s"] < QUIET, report
    assert result["verdict"] == "PASS" and run.returncode == 0, report


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_the_checker_names_rows_missed_or_doubled_and_the_fault_before_them(
        engine: Engine) -> None:
    with engine.begin() as conn:
        for statement in ddl(100):
            conn.execute(text(statement))
        conn.execute(text("INSERT INTO nemesis_rows (id, done, times) VALUES "
                          "(5, 1, 1), (6, 0, 0), (7, 1, 2)"))
        began = conn.execute(text("SELECT clock_timestamp() - interval '10 seconds'")).scalar()
    found = Findings()
    check_rows(engine, found, [(1.0, "kill_worker", "kill -9 nem-range0")], began)
    assert (found.rows_total, found.rows_once, found.rows_missed, found.rows_twice) == (3, 1, 1, 1)
    assert found.final_run == "none" and not found.passed
    assert any(p.startswith("row 6 processed 0 times") and "after kill_worker" in p
               for p in found.problems), found.problems
    assert any(p.startswith("row 7 processed 2 times") for p in found.problems)


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_the_checker_finds_stock_off_and_an_order_restocked_after_payment(
        engine: Engine, private_redis: RedisServer) -> None:
    with engine.begin() as conn:
        conn.execute(insert(SKUS).values(sku_id="s1", redis_id=0, total=10))
        for item, order, state in (("i1", "o1", "paid"), ("i2", "o2", "held"),
                                   ("i3", "o3", "restocked")):
            conn.execute(insert(ORDER_ITEMS).values(
                order_item_id=item, order_id=order, sku_id="s1", qty=2, redis_id=0,
                queue="q", state=state, time_ms=0))
        conn.execute(insert(PAYMENTS).values(order_id="o3"))
    client = redis.Redis.from_url(private_redis.url)
    client.hset(stock_key(0), "s1", 7)  # total 10 - held 2 - paid 2 = 6: one unit too many
    found = Findings()
    check_stock(engine, client, found)
    client.close()
    assert found.skus_inconsistent == 1
    assert found.orders_restocked_after_payment == 1
    assert any("expected total 10 - held - paid = 6" in p for p in found.problems)
