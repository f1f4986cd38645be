"""`python -m bench overhead [--tasks N] [--rounds R]`: the platform task base's cost.

Runs, in one run on the same real prefork worker: a no-op task on a bare Celery task class
(`devtools.samples.noop_bare`) and the same no-op on `PlatformTask`
(`devtools.samples.noop_platform`: retry policies, signals, journal support, no checkpoint
recorded). The two alternate in rounds, so drift in the machine's speed falls on both;
throughput is tasks completed per second from the first send to the last result.
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from celery import Celery

from bench.scratch import NotScratch, scratch_redis
from devtools.demo import Fleet

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
BENCH_REDIS_DB = 13


def _throughput(client: Celery, task: str, n: int) -> float:
    started = time.perf_counter()
    results = [client.send_task(task) for _ in range(n)]
    for result in results:
        result.get(timeout=120)
    return n / (time.perf_counter() - started)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench overhead", description=__doc__)
    parser.add_argument("--tasks", type=int, default=500, help="tasks per side per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        with scratch_redis(BENCH_REDIS_DB) as redis_url:
            return _run(args, redis_url)
    except NotScratch as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, redis_url: str) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    env = dict(os.environ, EXTRA_TASK_MODULES="devtools.samples", REDIS_URL=redis_url,
               PYTHONPATH=str(ROOT), DATABASE_URL=f"sqlite:///{workdir}/overhead.sqlite")
    fleet = Fleet(env, workdir)
    client = Celery(broker=redis_url, backend=redis_url, set_as_current=False)
    try:
        fleet.start("worker", "worker", "-P", "prefork", "-c", str(args.concurrency), "-n",
                    "overhead@%h", "--loglevel=WARNING", "--without-mingle", "--without-gossip")
        _wait_ready(client)
        _throughput(client, "devtools.samples.noop_bare", 50)  # warm up both pool processes
        _throughput(client, "devtools.samples.noop_platform", 50)
        bare: list[float] = []
        platform: list[float] = []
        for i in range(args.rounds):
            sides = [("bare", bare), ("platform", platform)]
            for side, into in sides if i % 2 == 0 else sides[::-1]:
                into.append(_throughput(client, f"devtools.samples.noop_{side}", args.tasks))
        b, p = statistics.median(bare), statistics.median(platform)
        print(f"bare Celery task:   {b:,.0f} tasks/s (rounds: {[round(x) for x in bare]})")
        print(f"platform task base: {p:,.0f} tasks/s (rounds: {[round(x) for x in platform]})")
        print(json.dumps({"bare_tasks_per_s": round(b, 1), "platform_tasks_per_s": round(p, 1),
                          "ratio": round(p / b, 3)}))
        return 0
    finally:
        client.close()
        fleet.stop_all()


def _wait_ready(client: Celery, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not client.control.ping(timeout=0.5):
        if time.monotonic() > deadline:
            raise RuntimeError("the benchmark worker did not start")
