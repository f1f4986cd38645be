"""The benchmarks run and report their checks (their speed is for `python -m bench`, not CI)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, platform_env


def test_bench_restock_loses_nothing_and_restocks_once(private_redis: RedisServer) -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "restock", "--entries", "400"],
                         env=platform_env(REDIS_URL=private_redis.url), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["entries"] == 400
    assert (figures["lost"], figures["double_restocks"]) == (0, 0)
    assert figures["platform_entries_per_s"] > 0 and figures["per_entry_baseline_per_s"] > 0
