"""`python -m bench failover` end to end, with a short lease TTL and reconcile interval so it
runs in well under a minute: real workers, a beat, this test worker's PostgreSQL database and a
private Redis. (Not SQLite: its one write lock, held through each slow batch, makes three
concurrent holders wait on each other past a 1.5 s lease on a loaded machine.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.db import DATABASES
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, platform_env

KEYS = {"lease_ttl_s", "reconcile_interval_s", "crash_failover_s", "pool_crash_failover_s",
        "graceful_handover_s", "saturated_crash_failover_s", "rows_lost", "rows_duplicated",
        "broker"}


@pytest.mark.timeout(240)
def test_bench_failover_takes_over_every_way_and_loses_nothing(
    private_redis: RedisServer,
) -> None:
    env = platform_env(REDIS_URL=private_redis.url)
    run = subprocess.run(
        [sys.executable, "-m", "bench", "failover", "--ttl", "1.5", "--interval", "0.5",
         "--db", DATABASES["postgresql"]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=220)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result) == KEYS
    assert (result["lease_ttl_s"], result["reconcile_interval_s"]) == (1.5, 0.5)
    assert result["rows_lost"] == result["rows_duplicated"] == 0
    assert result["broker"] == "redis"
    for key in ("crash_failover_s", "pool_crash_failover_s", "graceful_handover_s",
                "saturated_crash_failover_s"):
        assert result[key] > 0, result
    # Progress is printed as it goes, one line per step of each phase.
    assert sum("taken over after" in line for line in lines) == 4
    # With every range worker busy and fresh partitions queued, a running holder takes the
    # dead one's partition ahead of the queue: adopted at a batch boundary or, when its own
    # partition ended first (a loaded machine), popped as an orphan before any pending one.
    assert any("saturated: taken over" in line and ("adopted by a running holder" in line
                                                    or "taken as an orphan" in line)
               for line in lines), "\n".join(lines)
    # A crash waits for the lease to lapse; a warm shutdown hands over without waiting.
    assert result["crash_failover_s"] >= 1.0
    assert result["graceful_handover_s"] < result["crash_failover_s"]
    # A pool process's death is handed back by its worker's main process, without the TTL: at
    # this bench's 1.5 s TTL the two paths take about as long, so the bound is checked where
    # the TTL is long (tests/ranges/test_pool_exit.py, LEASE_TTL=30).
