"""`python -m bench lease [--url URL | --cluster] [--n N]`: lease operations against raw Redis
baselines.

With ``--cluster`` every side runs on a 3-master Redis Cluster the bench starts itself
(bench/cluster.py; ``--masters`` to change the count), through a redis-py RedisCluster client:
the raw baselines go through the same client, and the batch side is the keeper's round on a
cluster (one renew_many per slot, pipelined per master: lease/renewal.py).

Every ratio is platform ops/s divided by raw ops/s, measured in this run against the same
Redis. The sides run in alternating chunks (rotating which goes first), so drift in the
machine's speed falls on all alike; a ratio is the median of the per-chunk ratios.

- acquire:  Leases.acquire (script: SET NX PX + INCR fence)  vs  raw SET key val NX PX
- renew:    Lease.renew (token-checked script)                vs  raw EVALSHA of a trivial script
- release:  Lease.release (token-checked script)              vs  raw EVALSHA of a trivial script
- batch:    one Keeper.tick renewing --batch held leases      vs  --batch Lease.renew calls

A third side, the lease's own script sent by a bare EVALSHA, shows how much of each gap is
Redis running the script rather than the Python around it ("script alone").

The last line printed is JSON: acquire_ratio, renew_ratio, release_ratio, batch_renew_speedup
(and, with --cluster, cluster_masters).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import RedisCluster

from bench.cluster import bench_cluster
from devtools.embedded import NotScratch, claim_scratch, flush_scratch
from lease import Keeper, Lease, Leases
from lease.keys import fence_key, lease_key, waiting_key, wake_key
from lease.scripts import ACQUIRE, RELEASE, RENEW

__all__ = ["main"]

DEFAULT_URL = "redis://127.0.0.1:6379/10"  # flushed only if empty or marked (claim_scratch)
TRIVIAL_LUA = "return 1"
TTL = 60.0
TTL_MS = 60_000
CHUNK = 50  # operations per side per chunk: short, so a burst of noise spoils few
TOKEN = "x" * 32  # the raw side's value, as long as a lease token


class _Clock:
    """A clock the batch benchmark moves forward, so every tick finds every lease due."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


class _Race:
    """Seconds each side of one comparison took, chunk by chunk."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def run(self, chunk: int, sides: dict[str, Callable[[], object]]) -> None:
        order = list(sides.items())
        shift = chunk % len(order)
        for name, fn in order[shift:] + order[:shift]:
            start = time.perf_counter()
            fn()
            self.times.setdefault(name, []).append(time.perf_counter() - start)

    def total(self, side: str) -> float:
        return sum(self.times[side])

    def ratio(self, side: str, baseline: str = "raw") -> float:
        """`side` ops/s over `baseline` ops/s: the median over chunks, so a chunk that a busy
        machine happened to stall does not decide the result."""
        pairs = zip(self.times[side], self.times[baseline], strict=True)
        return statistics.median(base / took for took, base in pairs)


def _renew_all(held: list[Lease]) -> None:
    for lease in held:
        lease.renew()


def _release_all(held: list[Lease]) -> None:
    for lease in held:
        lease.release()


def _flush(client: Any) -> None:
    """Empty the benchmark's Redis: a scratch database, or the cluster the bench started."""
    if isinstance(client, RedisCluster):
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        flush_scratch(client)


def bench_acquire_release(client: Any, leases: Leases, n: int) -> tuple[_Race, _Race]:
    trivial, acquire_sha, release_sha = (
        client.script_load(text) for text in (TRIVIAL_LUA, ACQUIRE, RELEASE)
    )
    acquire, release = _Race(), _Race()
    for chunk in range(max(1, n // CHUNK)):
        names = [f"bench:a:{chunk}:{i}" for i in range(CHUNK)]
        raw_keys = [lease_key(f"bench:raw:{chunk}:{i}") for i in range(CHUNK)]
        bare = [f"bench:bare:{chunk}:{i}" for i in range(CHUNK)]
        held: list[Lease] = []

        def acquire_bare() -> None:
            for name in bare:  # noqa: B023
                # No fence floor: as Leases.acquire sends it (acquire.lua takes absent as 0).
                client.evalsha(acquire_sha, 2, lease_key(name), fence_key(name), TOKEN, TTL_MS)

        def release_bare() -> None:
            for name in bare:  # noqa: B023
                client.evalsha(release_sha, 3, lease_key(name), waiting_key(name),
                               wake_key(name), TOKEN, 1000)

        acquire.run(chunk, {
            "platform": lambda: held.extend(leases.acquire(name, ttl=TTL) for name in names),  # noqa: B023
            "raw": lambda: [client.set(k, TOKEN, nx=True, px=TTL_MS) for k in raw_keys],  # noqa: B023
            "script": acquire_bare,
        })
        release.run(chunk, {
            "platform": lambda: _release_all(held),  # noqa: B023
            "raw": lambda: [client.evalsha(trivial, 1, k, TOKEN) for k in raw_keys],  # noqa: B023
            "script": release_bare,
        })
    _flush(client)
    return acquire, release


def bench_renew(client: Any, leases: Leases, n: int) -> _Race:
    trivial, renew_sha = (client.script_load(text) for text in (TRIVIAL_LUA, RENEW))
    held = [leases.acquire(f"bench:r:{i}", ttl=TTL) for i in range(CHUNK)]
    race = _Race()
    for chunk in range(max(1, n // CHUNK)):
        race.run(chunk, {
            "platform": lambda: _renew_all(held),
            "raw": lambda: [client.evalsha(trivial, 1, lease._key, lease.token) for lease in held],
            "script": lambda: [client.evalsha(renew_sha, 1, lease._key, lease.token, TTL_MS)
                               for lease in held],
        })
    _release_all(held)
    return race


def bench_batch(client: Any, batch: int, rounds: int) -> _Race:
    """Platform side: one keeper tick renewing `batch` leases; raw side: `batch` renew calls."""
    clock = _Clock()
    keeper = Keeper(client, clock=clock, threads=False)
    leases = Leases(client, clock=clock, keeper=keeper)
    held = [leases.acquire(f"bench:b:{i}", ttl=TTL) for i in range(batch)]
    renewed: list[int] = []

    def tick() -> None:
        for lease in held:  # progress, no I/O; the holder does this, not the keeper
            lease.heartbeat()
        clock.now += TTL / 3
        renewed.append(keeper.tick())

    race = _Race()
    for r in range(rounds):
        race.run(r, {"platform": tick, "raw": lambda: _renew_all(held)})
    if renewed != [batch] * rounds:
        raise RuntimeError(f"ticks renewed {renewed} leases, expected {batch} each")
    _release_all(held)
    return race


def main(argv: list[str]) -> int:
    """Run the lease benchmark; print human-readable lines, then one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench lease", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=DEFAULT_URL,
                        help="Redis URL of an empty database (marked and then flushed) or of one "
                             "an earlier run marked; any other is refused")
    parser.add_argument("--cluster", action="store_true",
                        help="run on a Redis Cluster the bench starts (and stops) itself")
    parser.add_argument("--masters", type=int, default=3, help="the cluster's masters")
    parser.add_argument("--n", type=int, default=5000, help="operations per side")
    parser.add_argument("--batch", type=int, default=1000, help="leases renewed per tick")
    parser.add_argument("--rounds", type=int, default=10, help="ticks in the batch comparison")
    args = parser.parse_args(argv)

    if args.cluster:
        with bench_cluster(masters=args.masters) as cluster:
            client = cluster.client(socket_timeout=30)
            races = _run(client, args)
        extra = {"cluster_masters": args.masters}
    else:
        try:
            claim_scratch(args.url, "bench")
        except NotScratch as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
        races = _run(redis.Redis.from_url(args.url), args)
        extra = {}
    _report(*races, args)
    print(json.dumps({
        "acquire_ratio": round(races[0].ratio("platform"), 3),
        "renew_ratio": round(races[1].ratio("platform"), 3),
        "release_ratio": round(races[2].ratio("platform"), 3),
        "batch_renew_speedup": round(races[3].ratio("platform"), 1),
        **extra,
    }))
    return 0


def _run(client: Any, args: argparse.Namespace) -> tuple[_Race, _Race, _Race, _Race]:
    """(acquire, renew, release, batch) races on `client`, which is emptied before and after."""
    _flush(client)
    leases = Leases(client)
    try:
        acquire, release = bench_acquire_release(client, leases, args.n)
        renew = bench_renew(client, leases, args.n)
        batch = bench_batch(client, args.batch, args.rounds)
    finally:
        leases.close()
        _flush(client)
        client.close()
    return acquire, renew, release, batch


def _report(acquire: _Race, renew: _Race, release: _Race, batch: _Race,
            args: argparse.Namespace) -> None:
    n = max(1, args.n // CHUNK) * CHUNK
    for label, race, baseline in (
        ("acquire", acquire, "raw SET NX PX"),
        ("renew", renew, "raw EVALSHA  "),
        ("release", release, "raw EVALSHA  "),
    ):
        print(f"{label:8} {n / race.total('platform'):7.0f} ops/s   {baseline} "
              f"{n / race.total('raw'):7.0f} ops/s   ratio {race.ratio('platform'):.3f}   "
              f"(script alone {race.ratio('script'):.3f})")
    per_tick, per_calls = batch.total("platform") / args.rounds, batch.total("raw") / args.rounds
    print(f"batch    {args.batch} leases: one keeper tick {per_tick * 1000:.2f} ms, "
          f"{args.batch} renew calls {per_calls * 1000:.2f} ms, "
          f"speedup {batch.ratio('platform'):.1f}x")
