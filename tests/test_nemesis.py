"""The randomized fault run (`python -m bench nemesis`): its schedule is a function of the seed,
its fault proxy really cuts, delays and black-holes a real Redis, and a short fixed-seed run on
real workers, beats, Redis and PostgreSQL ends with verdict PASS and every count clean."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import redis

from bench.faultproxy import FaultProxy
from bench.nemesis.check import valid_ledgers
from bench.nemesis.faults import KINDS, WARMUP_S, describe, is_leader, schedule
from devtools.embedded import free_port
from tests.support.db import DATABASES
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


def test_a_beat_leads_after_it_became_leader_and_until_it_lost_the_lease() -> None:
    assert is_leader("--- start 1 ---\nbeat: became leader (fence 3)\n")
    assert not is_leader("--- start 1 ---\nbeat: became leader (fence 3)\n"
                         "beat: lost the leader lease; standing by\n")
    assert not is_leader("beat: became leader (fence 3)\n--- start 2 ---\n")


@pytest.fixture
def proxied() -> tuple[RedisServer, FaultProxy]:
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
    result = json.loads(run.stdout.strip().splitlines()[-1])
    report = run.stdout[-6000:]
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
