"""Real prefork workers for the rollback tests: a private Redis, a SQLite file, a sweeper.

`Platform.sweepers()` starts a sweeper worker of concurrency 2 on its own queue and a thread
that sends `tasks.rollback.sweep` every 0.3 s, as beat would, so two sweeps often run at once.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker

from tasks.rollback.tables import JOURNAL, OWNERS
from tests.support.redis_server import RedisServer
from tests.support.workers import Proc, platform_env, start_worker

MODULES = "tasks.rollback,tasks.examples.saga"

# The key patterns the rollback feature owns (journal leases and their fences, wake-up keys,
# handover markers, the demo ledgers): a soak test counts these.
ROLLBACK_KEYS = ("saga:*", "lease:{journal:*", "fence:{journal:*", "lease-waiting:{journal:*",
                 "lease-wake:{journal:*", "rollback-handover:*")


class Platform:
    def __init__(self, engine: Engine, server: RedisServer) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self.redis = redis.Redis.from_url(server.url)
        self.env = platform_env(REDIS_URL=server.url,
                                DATABASE_URL=engine.url.render_as_string(False),
                                LEASE_TTL="1.5")
        self.client = Celery(broker=server.url, backend=server.url)
        self.procs: list[Proc] = []
        self._stop = threading.Event()
        self._sweepers: list[threading.Thread] = []

    def worker(self, name: str, *extra: str, concurrency: int = 1) -> Proc:
        proc = start_worker(self.env, concurrency, name, "-I", MODULES, *extra)
        self.procs.append(proc)
        return proc

    def sweepers(self) -> None:
        proc = start_worker(self.env, 2, "sweeper", "-I", MODULES, "-Q", "sweeps")
        self.procs.append(proc)

        def beat() -> None:
            while not self._stop.wait(0.3):
                self.client.send_task("tasks.rollback.sweep", queue="sweeps", expires=1.0)

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        self._sweepers.append(thread)

    def ledger(self, order_id: str) -> list[str]:
        return [e.decode() for e in self.redis.lrange(f"saga:{order_id}", 0, -1)]

    def states(self) -> list[tuple[str, str]]:
        with self.engine.connect() as conn:
            return [(r.name, r.state) for r in conn.execute(
                select(JOURNAL).order_by(JOURNAL.c.id)).all()]

    def owners(self) -> list[tuple[str, str]]:
        with self.engine.connect() as conn:
            return [(r.task_id, r.state) for r in conn.execute(
                select(OWNERS).order_by(OWNERS.c.task_id)).all()]

    def rollback_keys(self) -> list[bytes]:
        return [k for pattern in ROLLBACK_KEYS for k in self.redis.scan_iter(match=pattern)]

    def close(self) -> None:
        self._stop.set()
        for thread in self._sweepers:
            thread.join()
        for proc in self.procs:
            proc.kill()
            proc.stop()  # closes its log file (the process is gone already)
        self.client.close()
        self.redis.close()


def pool_children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def undone_once(p: Platform, order: str) -> bool:
    entries = p.ledger(order)
    return entries.count("refund") == 1 and entries.count("release_stock") == 1


def outcome(result: Any) -> str:
    """`STATE ExceptionType` of a finished AsyncResult, e.g. 'FAILURE JournalLost'."""
    return f"{result.state} {type(result.result).__name__}"
