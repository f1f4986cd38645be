"""`python -m bench restock --cluster [--entries N] [--paid F] [--shards S] [--repeat R]`.

The restock benchmark on Redis Clusters the bench starts itself (bench/cluster.py), one with 1
and one with 3 masters, both up for the whole run: N redo entries spread over S logical shards
(SKUs of every shard), each shard's slot placed on master shard % masters (what an operator's
resharding does to balance shards), then

- platform: per shard `Drainer.sync` and `Drainer.drain` (batches of 100), the shards drained
  by 4 threads; run R times on each cluster, alternating 1, 3, 1, 3... so that load from
  outside the bench (a shared machine) falls on both alike; the median counts;
- baseline, the seed's way on the same cluster: per entry one sync call, one payment query and
  one restock call (once per cluster: at ~20 s a run it averages load out by itself).

Prints each master's share of the entries and a JSON line per master count:
{"masters", "entries", "shards", "platform_entries_per_s", "per_entry_baseline_per_s",
"ratio", "shares", "max_share_deviation", "lost", "double_restocks", "platform_runs_per_s",
"client_cpu_s", "servers_cpu_s"}: the two CPU figures are the medians, over the platform runs,
of this process's CPU seconds (every thread) and of all the cluster's redis-servers' together
(INFO cpu). Then one line {"throughput_3_vs_1", "baseline_3_vs_1", "cores"}: the platform's and
the raw baseline's 3-master throughput over the 1-master one (on this 2-core machine three
masters cannot triple it: watch it not fall).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from redis.crc import key_slot
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session, sessionmaker

from bench.cluster import BenchCluster, bench_cluster
from tasks.restock.drain import Drainer
from tasks.restock.keys import delay_key, drain_lease_name, shard_tag, stock_key
from tasks.restock.redolog import parse_entry
from tasks.restock.routing import Router
from tasks.restock.shards import StockShard, close_shards, connect_shards
from tasks.restock.tables import ORDER_ITEMS, ORDERS, SKUS, ItemState
from tasks.store.db import utcnow
from tasks.store.migrate import upgrade
from tasks.store.resources import make_engine

__all__ = ["main"]

QUEUE = "q0"
T0 = 1_700_000_000_000
DELAY_MS = 1_000
START_STOCK = 10**9
SKUS_PER_SHARD = 4

# A run: (sessions, shards, now in ms) -> entries accounted for.
Runner = Callable[[sessionmaker[Session], list[StockShard], int], int]


def _skus(shards: int) -> dict[int, list[str]]:
    """SKUS_PER_SHARD SKU ids of each shard (found by the router's own mapping)."""
    router, found = Router(shards, (QUEUE,)), {s: [] for s in range(shards)}  # type: ignore[var-annotated]
    n = 0
    while any(len(v) < SKUS_PER_SHARD for v in found.values()):
        sku = f"sku-{n}"
        if len(found[router.shard_for(sku)]) < SKUS_PER_SHARD:
            found[router.shard_for(sku)].append(sku)
        n += 1
    return found


def prepare(engine: Engine, nodes: list[StockShard], entries: int, paid: float
            ) -> tuple[int, int, Counter[int]]:
    """Fresh tables and keys; `entries` deductions spread over the shards, a `paid` share
    paid. Returns (unpaid units, stock before, entries per shard)."""
    nodes[0].client.flushall()
    upgrade(engine)
    with engine.begin() as conn:
        for table in (ORDER_ITEMS, ORDERS, SKUS):
            conn.execute(table.delete())
    rng = random.Random(7)
    by_shard = _skus(len(nodes))
    with engine.begin() as conn:
        conn.execute(insert(SKUS), [{"sku_id": s, "redis_id": shard, "total": START_STOCK,
                                     "created_at": utcnow()}
                                    for shard, skus in by_shard.items() for s in skus])
    for shard, skus in by_shard.items():
        nodes[shard].client.hset(stock_key(shard), mapping=dict.fromkeys(skus, START_STOCK))
    items, per_shard = [], Counter[int]()
    for i in range(entries):
        shard = rng.randrange(len(nodes))
        sku, qty = rng.choice(by_shard[shard]), rng.randint(1, 3)
        nodes[shard].scripts.deduct(shard, QUEUE, f"i-{i}", sku, qty, "m-1")
        items.append((f"i-{i}", sku, qty, shard, rng.random() < paid))
        per_shard[shard] += 1
    with engine.begin() as conn:
        conn.execute(insert(ORDERS), [{"order_id": f"o-{oid}", "member_id": "m-1",
                                       "created_at": utcnow()} for oid, *_ in items])
        conn.execute(insert(ORDER_ITEMS), [
            {"order_item_id": oid, "order_id": f"o-{oid}", "sku_id": sku, "qty": qty,
             "redis_id": shard, "queue": QUEUE,
             "state": ItemState.PAID if is_paid else ItemState.HELD, "time_ms": T0,
             "updated_at": utcnow()} for oid, sku, qty, shard, is_paid in items])
    unpaid = sum(qty for _, _, qty, _, is_paid in items if not is_paid)
    return unpaid, _stock(nodes), per_shard


def _stock(nodes: list[StockShard]) -> int:
    return sum(int(v) for n in nodes for v in n.client.hvals(stock_key(n.number)))


def run_platform(sessions: sessionmaker[Session], nodes: list[StockShard], now: int) -> int:
    def one(node: StockShard) -> int:
        drainer = Drainer(sessions, node, batch=100, delay_ms=DELAY_MS, lease_ttl=30.0)
        drainer.sync(QUEUE, count=1000)
        report = drainer.drain(QUEUE)
        return sum(report.statuses.values()) + report.dead_lettered

    with ThreadPoolExecutor(4) as pool:
        return sum(pool.map(one, nodes))


def run_baseline(sessions: sessionmaker[Session], nodes: list[StockShard], now: int) -> int:
    accounted = 0
    for node in nodes:
        shard, scripts = node.number, node.scripts
        lease = node.leases.acquire(drain_lease_name(shard, QUEUE), ttl=3600.0, renew=False)
        token = lease.token
        while scripts.sync(shard, QUEUE, count=1, delay_ms=DELAY_MS):
            pass
        while members := node.client.zrangebyscore(delay_key(shard, QUEUE), "-inf", now,
                                                   start=0, num=100):
            for member in members:
                entry = parse_entry(cast(bytes, member))
                with sessions() as session:
                    state = session.execute(select(ORDER_ITEMS.c.state).where(
                        ORDER_ITEMS.c.order_item_id == entry.order_item_id)).scalar()
                scripts.restock(shard, QUEUE, token, [(entry, state == ItemState.PAID)])
                accounted += 1
        lease.release()
    return accounted


@dataclass
class OnCluster:
    """One cluster of the run: its database, its shards, and the figures measured on it."""

    cluster: BenchCluster
    engine: Engine
    nodes: list[StockShard]
    checks: Counter[str] = field(default_factory=Counter)
    per_shard: Counter[int] = field(default_factory=Counter)
    baseline: float = 0.0
    runs: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    servers_cpu: list[float] = field(default_factory=list)

    @property
    def masters(self) -> int:
        return len(self.cluster.ports)

    def line(self, args: argparse.Namespace) -> dict[str, Any]:
        """The JSON line of this cluster (medians of the platform runs)."""
        shares: Counter[int] = Counter()
        for shard, count in self.per_shard.items():
            shares[self.cluster.owner(key_slot(shard_tag(shard).encode()))] += count
        share = [round(shares[m] / args.entries, 3) for m in range(self.masters)]
        platform = statistics.median(self.runs)
        return {"masters": self.masters, "entries": args.entries, "shards": args.shards,
                "platform_entries_per_s": round(platform, 1),
                "per_entry_baseline_per_s": round(self.baseline, 1),
                "ratio": round(platform / self.baseline, 2), "shares": share,
                "max_share_deviation": round(max(abs(s * self.masters - 1) for s in share), 3),
                "lost": self.checks["lost"], "double_restocks": self.checks["double_restocks"],
                "platform_runs_per_s": [round(r, 1) for r in self.runs],
                "client_cpu_s": round(statistics.median(self.client_cpu), 2),
                "servers_cpu_s": round(statistics.median(self.servers_cpu), 2)}


@contextmanager
def on_cluster(masters: int, args: argparse.Namespace, tmp: str) -> Iterator[OnCluster]:
    """A cluster of `masters` with its shards balanced (shard N on master N % masters)."""
    engine = make_engine(args.db or f"sqlite:///{Path(tmp) / f'bench{masters}.sqlite'}")
    try:
        with bench_cluster(masters) as cluster:
            for shard in range(args.shards):
                cluster.assign(key_slot(shard_tag(shard).encode()), shard % masters)
            nodes = connect_shards([cluster.client(socket_timeout=10.0)], args.shards)
            try:
                yield OnCluster(cluster, engine, nodes)
            finally:
                close_shards(nodes)
    finally:
        engine.dispose()


def _servers_cpu(cluster: BenchCluster) -> float:
    """CPU seconds used so far by every redis-server of `cluster` (INFO cpu)."""
    total = 0.0
    for i in range(len(cluster.ports)):
        node = cluster.node(i)
        cpu = node.info("cpu")
        node.close()
        total += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return total


def measure(on: OnCluster, name: str, run: Runner, args: argparse.Namespace) -> float:
    """One run of `run` on freshly prepared entries; its entries/s. Adds what it lost or
    doubled to `on.checks`; a platform run also records the CPU it took."""
    sessions = sessionmaker(on.engine, expire_on_commit=False)
    unpaid, before, on.per_shard = prepare(on.engine, on.nodes, args.entries, args.paid)
    time.sleep(DELAY_MS / 1000 + 0.3)  # every entry due by the masters' clocks
    cpu, servers = time.process_time(), _servers_cpu(on.cluster)
    started = time.perf_counter()
    accounted = run(sessions, on.nodes, int(time.time() * 1000) + 10**6)
    seconds = time.perf_counter() - started
    if name == "platform":
        on.client_cpu.append(time.process_time() - cpu)
        on.servers_cpu.append(_servers_cpu(on.cluster) - servers)
    returned = _stock(on.nodes) - before
    left = sum(on.nodes[0].client.zcard(delay_key(n.number, QUEUE)) for n in on.nodes)
    on.checks["lost"] += max(args.entries - accounted, 0) + left
    on.checks["lost"] += max(unpaid - returned, 0)
    on.checks["double_restocks"] += max(returned - unpaid, 0)
    print(f"{on.masters} master(s), {name}: {args.entries:,} entries in {seconds:.2f}s "
          f"= {args.entries / seconds:,.0f} entries/s")
    return args.entries / seconds


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench restock --cluster",
                                     description=__doc__)
    parser.add_argument("--cluster", action="store_true", required=True)
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--paid", type=float, default=0.3, help="share of paid orders")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3,
                        help="platform runs per cluster (the median counts)")
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: a SQLite file)")
    args = parser.parse_args(argv)
    if args.entries <= 0 or args.shards <= 0 or args.repeat <= 0 or not 0 <= args.paid <= 1:
        parser.error("entries, shards and repeat must be > 0 and paid in [0, 1]")
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        runs = [stack.enter_context(on_cluster(masters, args, tmp)) for masters in (1, 3)]
        for on in runs:
            on.baseline = measure(on, "baseline", run_baseline, args)
        for _ in range(args.repeat):  # alternating, so outside load falls on both alike
            for on in runs:
                on.runs.append(measure(on, "platform", run_platform, args))
        lines = [on.line(args) for on in runs]
    for line in lines:
        print(f"{line['masters']} master(s): platform / per-entry baseline "
              f"{line['ratio']:.2f}x, shares {line['shares']}")
    for line in lines:
        print(json.dumps(line))
    one, three = lines
    print(json.dumps({
        "throughput_3_vs_1": round(three["platform_entries_per_s"]
                                   / one["platform_entries_per_s"], 2),
        "baseline_3_vs_1": round(three["per_entry_baseline_per_s"]
                                 / one["per_entry_baseline_per_s"], 2),
        "cores": os.cpu_count()}))
    return 0
