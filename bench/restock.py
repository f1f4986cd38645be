"""`python -m bench restock [--entries N] [--db URL] [--paid FRACTION]` (one Redis; with
`--cluster`: bench/restock_cluster.py, on a cluster the bench starts).

Measures, in one run on the same Redis and database, the time to sync and restock N due redo
entries (a share of their orders paid):

- platform: `Drainer.sync` (1,000 entries per script call) then `Drainer.drain` (batches of
  100: one payment lookup and one restock script call per batch);
- baseline, the seed's way: one sync script call per entry, one payment query per entry and
  one restock script call per entry, no batching (and, as in the seed, no compare-and-set
  against a concurrent payment: the platform does that work too, once per batch).

Both runs start from the same freshly deducted state. Prints entries/s of each, their ratio,
and a final JSON line {"entries", "platform_entries_per_s", "per_entry_baseline_per_s",
"ratio", "lost", "double_restocks"}: lost counts entries neither restocked nor skipped (or
left queued), double_restocks the units returned beyond what the unpaid items held.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import redis
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session, sessionmaker

from devtools.demo import reset_database
from devtools.embedded import NotScratch, demo_redis, flush_scratch
from lease import Leases
from tasks.restock.drain import Drainer
from tasks.restock.keys import deduct_keys, delay_key, drain_lease_name, stock_key
from tasks.restock.redolog import RedoEntry, parse_entry
from tasks.restock.replies import ACTIONS, Action
from tasks.restock.scripts import StockScripts
from tasks.restock.shards import StockShard
from tasks.restock.tables import ORDER_ITEMS, ORDERS, SKUS, ItemState
from tasks.store.db import utcnow
from tasks.store.migrate import upgrade
from tasks.store.resources import make_engine

__all__ = ["main"]

BENCH_REDIS_DB = 12
NODE, QUEUE = 0, "q0"
SKU_COUNT = 50
T0 = 1_700_000_000_000
DELAY_MS = 1_000
START_STOCK = 10**9


@dataclass
class Prepared:
    unpaid_units: int
    stock_before: int


def prepare(engine: Engine, client: redis.Redis, entries: int, paid: float, seed: int
            ) -> Prepared:
    """Fresh tables and keys; `entries` items deducted in Redis (one redo entry each) and
    recorded in the database, a `paid` share of them paid."""
    flush_scratch(client)
    reset_database(engine)
    upgrade(engine)
    rng = random.Random(seed)
    skus = [f"sku-{i}" for i in range(SKU_COUNT)]
    with engine.begin() as conn:
        conn.execute(insert(SKUS), [{"sku_id": s, "redis_id": NODE, "total": START_STOCK,
                                     "created_at": utcnow()} for s in skus])
    client.hset(stock_key(NODE), mapping=dict.fromkeys(skus, START_STOCK))
    scripts = StockScripts(client)
    items = []
    for start in range(0, entries, 1000):
        with client.pipeline(transaction=False) as pipe:
            batch = []
            for i in range(start, min(start + 1000, entries)):
                sku, qty = rng.choice(skus), rng.randint(1, 3)
                batch.append((f"i-{i}", sku, qty, rng.random() < paid))
                keys = deduct_keys(NODE, QUEUE)
                pipe.evalsha(scripts.deduct_script.sha, len(keys), *keys, f"i-{i}", sku,
                             str(qty), T0, "m-1", QUEUE, NODE, 1_000_000, 0, 0)
            if start == 0:
                client.script_load(scripts.deduct_script.script)
            pipe.execute()
        items += batch
    with engine.begin() as conn:
        conn.execute(insert(ORDERS), [{"order_id": f"o-{oid}", "member_id": "m-1",
                                       "created_at": utcnow()} for oid, *_ in items])
        conn.execute(insert(ORDER_ITEMS), [
            {"order_item_id": oid, "order_id": f"o-{oid}", "sku_id": sku, "qty": qty,
             "redis_id": NODE, "queue": QUEUE,
             "state": ItemState.PAID if is_paid else ItemState.HELD, "time_ms": T0,
             "updated_at": utcnow()} for oid, sku, qty, is_paid in items])
    unpaid_units = sum(qty for _, _, qty, is_paid in items if not is_paid)
    return Prepared(unpaid_units, _stock(client))


def _due_time(entries: int) -> int:
    """A wall-clock time at which every one of `entries` synced entries is due."""
    return T0 + 10 * DELAY_MS + 10 * entries


def _stock(client: redis.Redis) -> int:
    return sum(int(v) for v in client.hvals(stock_key(NODE)))


def run_platform(sessions: sessionmaker[Session], client: redis.Redis, entries: int
                 ) -> tuple[float, int]:
    """Returns (seconds, entries accounted for)."""
    # A fixed node clock (the entries were stamped at T0 on it) at which every entry is due.
    node = StockShard.on(NODE, client, clock=lambda: _due_time(entries))
    drainer = Drainer(sessions, node, batch=100, delay_ms=DELAY_MS, lease_ttl=30.0)
    started = time.perf_counter()
    drainer.sync(QUEUE, count=1000)
    report = drainer.drain(QUEUE)
    elapsed = time.perf_counter() - started
    node.close()
    return elapsed, sum(report.statuses.values()) + report.dead_lettered


def run_baseline(sessions: sessionmaker[Session], client: redis.Redis, entries: int
                 ) -> tuple[float, int]:
    """The seed's way: per entry one sync call, one payment query, one restock call."""
    scripts = StockScripts(client)
    leases = Leases(client)
    lease = leases.acquire(drain_lease_name(NODE, QUEUE), ttl=3600.0, renew=False)
    token = lease.token
    now = _due_time(entries)
    accounted = 0
    started = time.perf_counter()
    while scripts.sync(NODE, QUEUE, count=1, delay_ms=DELAY_MS):
        pass
    while members := client.zrangebyscore(delay_key(NODE, QUEUE), "-inf", now, start=0,
                                          num=100):
        for member in members:
            entry: RedoEntry = parse_entry(cast(bytes, member))
            with sessions() as session:
                state = session.execute(select(ORDER_ITEMS.c.state).where(
                    ORDER_ITEMS.c.order_item_id == entry.order_item_id)).scalar()
            (result,) = scripts.restock(NODE, QUEUE, token, [(entry, state == ItemState.PAID)])
            assert ACTIONS[result.status] in (Action.RESTOCKED, Action.SKIPPED)
            accounted += 1
    elapsed = time.perf_counter() - started
    lease.release()
    leases.close()
    return elapsed, accounted


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench restock", description=__doc__)
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--paid", type=float, default=0.3, help="share of paid orders")
    parser.add_argument("--db", default=None, help="SQLAlchemy URL (default: a SQLite file)")
    args = parser.parse_args(argv)
    if args.entries <= 0 or not 0 <= args.paid <= 1:
        parser.error("entries must be > 0 and paid in [0, 1]")
    return args


def main(argv: list[str]) -> int:
    if "--cluster" in argv:
        from bench.restock_cluster import main as on_cluster

        return on_cluster(argv)
    args = _parse(argv)
    try:
        redis_url, embedded = demo_redis(BENCH_REDIS_DB, "bench")
    except NotScratch as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    client = redis.Redis.from_url(redis_url)
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(args.db or f"sqlite:///{Path(tmp) / 'bench.sqlite'}")
        sessions = sessionmaker(engine, expire_on_commit=False)
        try:
            figures = {}
            checks = {"lost": 0, "double_restocks": 0}
            for name, run in (("baseline", run_baseline), ("platform", run_platform)):
                prepared = prepare(engine, client, args.entries, args.paid, seed=7)
                seconds, accounted = run(sessions, client, args.entries)
                returned = _stock(client) - prepared.stock_before
                left = client.zcard(delay_key(NODE, QUEUE))
                checks["lost"] += max(args.entries - accounted, 0) + left
                checks["lost"] += max(prepared.unpaid_units - returned, 0)
                checks["double_restocks"] += max(returned - prepared.unpaid_units, 0)
                figures[name] = args.entries / seconds
                print(f"{name}: {args.entries:,} entries in {seconds:.2f}s = "
                      f"{figures[name]:,.0f} entries/s (units returned {returned:,} of "
                      f"{prepared.unpaid_units:,} unpaid)")
        finally:
            engine.dispose()
            client.close()
            if embedded is not None:
                embedded.stop()
    ratio = figures["platform"] / figures["baseline"]
    print(f"platform / per-entry baseline: {ratio:.2f}x")
    print(json.dumps({"entries": args.entries,
                      "platform_entries_per_s": round(figures["platform"], 1),
                      "per_entry_baseline_per_s": round(figures["baseline"], 1),
                      "ratio": round(ratio, 2), **checks}))
    return 0

