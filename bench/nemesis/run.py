"""`python -m bench nemesis --seed N --duration S`: a randomized fault run the project owns.

On real processes: a private redis-server (port --redis-port) behind a fault proxy (port
--proxy-port) that every platform process and the application use, two range workers
(`-Q ranges,celery`, prefork, 2 slots), a control worker (`-Q control,restock`), two beats;
PostgreSQL (--db) reached directly. For --duration seconds the load (bench/nemesis/load.py)
runs a range job over `nemesis_rows` while rows are inserted out of id order and deleted,
restock orders and payments, and sagas with failures and revokes; the nemesis
(bench/nemesis/faults.py) applies a fault every 2-5 s, drawn from `random.Random(seed)`. Then
it heals, waits for quiet (at most --quiet-timeout), and the checker (bench/nemesis/check.py)
reads SQL and Redis directly. The last line is JSON; the exit code is 1 on verdict FAIL.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import Engine, text

from bench.failover import ensure_database
from bench.faultproxy import FaultProxy
from bench.nemesis.check import check, summary
from bench.nemesis.faults import Nemesis, describe, schedule
from bench.nemesis.fleet import ROOT, RedisProc, Supervisor
from bench.nemesis.heal import heal, replace_stuck_orders, silent_workers, wait_quiet
from bench.nemesis.job import ddl
from bench.nemesis.load import APP_ID_CEILING, SKUS, Load
from devtools.demo import reset_database
from tasks.config.settings import redact
from tasks.store.migrate import upgrade
from tasks.store.resources import make_engine
from tasks.wings import WINGS, load_settings
from tasks.worker.queues import routing_config

__all__ = ["main"]

DEFAULT_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_nemesis"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench nemesis", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    parser.add_argument("--db", default=DEFAULT_DB, help="PostgreSQL URL (SQLAlchemy)")
    parser.add_argument("--redis-port", type=int, default=6500)
    parser.add_argument("--proxy-port", type=int, default=6600)
    parser.add_argument("--ttl", type=float, default=2.0, help="LEASE_TTL")
    parser.add_argument("--interval", type=float, default=1.0, help="RECONCILE_INTERVAL")
    parser.add_argument("--rows", type=int, default=3000, help="rows seeded before the run")
    parser.add_argument("--quiet-timeout", type=float, default=120.0,
                        help="the bound on the wait for quiet after healing")
    args = parser.parse_args(argv)
    if not args.db.startswith("postgresql"):
        parser.error("--db must be a PostgreSQL URL (the run uses a cached sequence)")
    if not (args.duration > 0 and args.ttl > 0 and args.interval > 0 and args.rows > 0):
        parser.error("--duration, --ttl, --interval and --rows must be greater than 0")
    return args


def _rate(args: argparse.Namespace) -> float:
    """The job's cap in rows/s: the seeded rows take about 80% of the fault window."""
    return max(round(args.rows / (0.8 * args.duration), 1), 5.0)


def platform_env(args: argparse.Namespace, proxy_url: str) -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", REDIS_URL=proxy_url,
        BROKER_URL=proxy_url, RESULT_BACKEND=proxy_url, DATABASE_URL=args.db,
        LEASE_TTL=str(args.ttl), RECONCILE_INTERVAL=str(args.interval), RANGE_SETTLE="3",
        RESTOCK_DELAY="3", RESTOCK_INTERVAL="0.5", EXTRA_TASK_MODULES="bench.nemesis.job",
        NEMESIS_PARTITION_SIZE="500", NEMESIS_BATCH_SIZE="25", NEMESIS_BATCH_DELAY="0.05",
        NEMESIS_ROWS_PER_S=str(_rate(args)),
    )


def prepare(engine: Engine, rows: int) -> None:
    """The platform's tables afresh, `nemesis_rows` seeded from APP_ID_CEILING up; the
    sequence goes on from the seeded rows, as a table's own sequence would."""
    reset_database(engine)
    upgrade(engine)
    with engine.begin() as conn:
        for statement in ddl(APP_ID_CEILING + rows):
            conn.execute(text(statement))
        conn.execute(text("INSERT INTO nemesis_rows (id) "
                          "SELECT generate_series(CAST(:lo AS BIGINT), CAST(:hi AS BIGINT))"),
                     {"lo": APP_ID_CEILING, "hi": APP_ID_CEILING + rows - 1})


def client_for(env: dict[str, str]) -> Celery:
    """The application's Celery client (through the proxy), routing as the platform does."""
    settings = load_settings(env)
    client = Celery(broker=settings.broker_url, backend=settings.result_backend,
                    set_as_current=False)
    client.conf.update(routing_config(settings, WINGS))
    timeouts = {"socket_timeout": 5, "socket_connect_timeout": 3}
    client.conf.update(broker_transport_options=timeouts, redis_socket_timeout=5,
                       redis_socket_connect_timeout=3, result_backend_transport_options=timeouts,
                       task_serializer="json", accept_content=["json"],
                       result_accept_content=["json"])
    return client


def start_fleet(env: dict[str, str], logs: Path) -> Supervisor:
    supervisor = Supervisor(env, logs)
    for i in range(2):
        supervisor.add_worker(f"nem-range{i}", "ranges,celery", 2, "range")
    supervisor.add_worker("nem-control", "control,restock", 2, "control")
    for i in range(2):
        supervisor.add_beat(f"nem-beat{i}")
    supervisor.start()
    return supervisor


def _define(client: Celery) -> None:
    for sku, total in SKUS.items():
        client.send_task("tasks.restock.define_sku", args=[sku, total]).get(timeout=60)


def _db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        now: datetime = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    return now


def _verdict(args: argparse.Namespace, nemesis: Nemesis, found: Any, quiet_s: float,
             still: str | None) -> dict[str, Any]:
    faults = dict(sorted(nemesis.counts.items()))
    return {"seed": args.seed, "duration_s": args.duration, "faults": faults,
            **summary(found), "time_to_quiescence_s": round(quiet_s, 1),
            "faults_not_landed": dict(sorted(nemesis.missed.items())),
            "rows_total": found.rows_total, "final_run": found.final_run,
            "orders_restocked_after_payment": found.orders_restocked_after_payment,
            "sagas": found.sagas_judged,
            "workers_silent": found.workers_silent, "quiet": still is None,
            "verdict": "PASS" if found.passed and still is None else "FAIL"}


def exercise(args: argparse.Namespace, engine: Engine, logs: Path) -> dict[str, Any]:
    redis_proc = RedisProc(args.redis_port, logs).start()
    try:
        proxy = FaultProxy(args.proxy_port, args.redis_port).start()
    except OSError as exc:
        redis_proc.kill()
        raise SystemExit(f"bench nemesis: cannot listen on 127.0.0.1:{args.proxy_port} "
                         f"({exc.strerror}); choose another --proxy-port") from None
    env = platform_env(args, f"redis://127.0.0.1:{args.proxy_port}/0")
    supervisor = start_fleet(env, logs)
    client = client_for(env)
    try:
        _define(client)
        nemesis = Nemesis(supervisor, redis_proc, proxy, engine, env, _rate(args), client)
        print(f"  {nemesis.jobs('start')}", flush=True)
        faults = schedule(args.seed, args.duration, args.ttl)
        print(f"schedule (seed {args.seed}): {len(faults)} faults {describe(faults)}", flush=True)
        load = Load(args.seed, engine, lambda: client_for(env))
        began_db, began = _db_now(engine), time.monotonic()
        load.start(began)
        nemesis.run(faults, began)
        time.sleep(max(nemesis.began + args.duration - time.monotonic(), 0))
        print("healing", flush=True)
        heal(nemesis, load, engine)
        quiet_s, still = wait_quiet(engine, args.quiet_timeout, 3 * args.interval + 2,
                                   lambda: replace_stuck_orders(load, engine))
        print(f"quiet after {quiet_s:.1f}s" if still is None
              else f"not quiet after {quiet_s:.1f}s: {still}", flush=True)
        silent = silent_workers(supervisor, redis_proc.url)
        found = check(engine, redis_proc.url, load.sagas, nemesis.ledgers, nemesis.log,
                      began_db, silent)
        print(f"load: done {dict(load.done)}, errors {dict(load.errors)}", flush=True)
        for problem in found.problems[:50]:
            print(f"  FAIL: {problem}", flush=True)
        return _verdict(args, nemesis, found, quiet_s, still)
    finally:
        client.close()
        supervisor.stop()
        proxy.stop()
        redis_proc.kill()
        gc.collect()  # results held by the client warn on collection: before the JSON line


def main(argv: list[str]) -> int:
    args = _parse(argv)
    logs = Path(tempfile.mkdtemp(prefix="bench-nemesis-"))
    print(f"bench nemesis: seed {args.seed}, {args.duration:g}s of faults, database "
          f"{redact(args.db)}, Redis :{args.redis_port} behind proxy :{args.proxy_port}, "
          f"logs in {logs}", flush=True)
    ensure_database(args.db)
    engine = make_engine(args.db)
    try:
        prepare(engine, args.rows)
        result = exercise(args, engine, logs)
    finally:
        engine.dispose()
    print(json.dumps(result), flush=True)
    return 0 if result["verdict"] == "PASS" else 1
