"""What the application does while the faults land, each in a thread with its own seeded
random stream (`random.Random(f"{seed}-{name}")`):

- `sequence-a`, `sequence-b`: two pooled connections insert rows with ids from `nemesis_seq`
  (CACHE 20: each session holds a block of 20, so their rows land out of id order);
- `app-ids`: application-assigned ids, below every id the table started with;
- `deletes`: deletes a random row now and then (done or not);
- `orders`: restock orders through `tasks.restock.place_order`, about half paid at a random
  moment, before or after their RESTOCK_DELAY expiry;
- `sagas`: `bench.nemesis.saga` with a random failing step, some revoked (terminate) mid-run.

Errors (Redis away, a lock) are counted and the thread carries on, as an application would.
Every order placed and saga sent is recorded, with when, for the checker.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from bench.nemesis.job import SAGA

__all__ = ["Load", "SagaSent", "SKUS", "APP_ID_CEILING"]

SKUS = {"nem-red": 400, "nem-green": 200, "nem-blue": 100}
APP_ID_CEILING = 1000  # application ids are drawn below this; seeded rows start above it
FAIL_AT = (None, None, "charge", "ship", "reserve_stock")


@dataclass(frozen=True)
class SagaSent:
    order_id: str
    task_id: str
    fail_at: str | None
    sent_at: float  # seconds after the load began
    revoked: bool


@dataclass
class Load:
    """The load threads; `start` them, `stop` them (joined), then read what they did."""

    seed: int
    engine: Engine
    new_client: Callable[[], Any]  # a fresh Celery client through the fault proxy
    orders: dict[str, tuple[str, list[list[Any]]]] = field(default_factory=dict)  # member, items
    sagas: list[SagaSent] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    done: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _timers: list[threading.Timer] = field(default_factory=list)
    _t0: float = 0.0
    client: Any = None

    def renew(self) -> None:
        """A new client: after a reset, Celery's Redis result consumer gives up for good
        ("The Celery application must be restarted"), so the application makes a new one.
        The old one is left to the threads still using it."""
        self.client = self.new_client()

    def start(self, began: float) -> None:
        """Start the threads; times are recorded as seconds after `began` (monotonic)."""
        self._t0 = began
        self.renew()
        loops: dict[str, Callable[[random.Random], None]] = {
            "sequence-a": self._sequence, "sequence-b": self._sequence,
            "app-ids": self._app_ids, "deletes": self._deletes,
            "orders": self._orders, "sagas": self._sagas,
        }
        for name, loop in loops.items():
            rng = random.Random(f"{self.seed}-{name}")
            thread = threading.Thread(target=self._run, args=(name, loop, rng), daemon=True,
                                      name=f"load-{name}")
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for timer in self._timers:
            timer.cancel()  # a payment not made yet is one the customer never made
        for thread in [*self._threads, *self._timers]:
            thread.join(60)

    def _run(self, name: str, loop: Callable[[random.Random], None], rng: random.Random) -> None:
        while not self._stop.is_set():
            try:
                loop(rng)
                self.done[name] += 1
            except Exception as exc:  # noqa: BLE001 - the application retries on its next round
                self.errors[f"{name}: {type(exc).__name__}"] += 1
                self._stop.wait(0.5)

    # rows ---------------------------------------------------------------------------------

    def _sequence(self, rng: random.Random) -> None:
        # One connection held per thread: its session keeps its cached block of 20 ids.
        with self.engine.connect() as conn:
            while not self._stop.is_set():
                with conn.begin():
                    conn.execute(text("SET LOCAL lock_timeout = '2s'"))
                    conn.execute(text("INSERT INTO nemesis_rows (id) "
                                      "VALUES (nextval('nemesis_seq'))"))
                self.done["rows inserted"] += 1
                self._stop.wait(rng.uniform(0.05, 0.4))

    def _app_ids(self, rng: random.Random) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '2s'"))
            found = conn.execute(text("INSERT INTO nemesis_rows (id) VALUES (:id) "
                                      "ON CONFLICT DO NOTHING"),
                                 {"id": rng.randrange(1, APP_ID_CEILING)})
        self.done["rows inserted"] += found.rowcount
        self._stop.wait(rng.uniform(0.2, 0.8))

    def _deletes(self, rng: random.Random) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '2s'"))
            found = conn.execute(text(
                "DELETE FROM nemesis_rows WHERE id = (SELECT id FROM nemesis_rows "
                "ORDER BY id OFFSET (SELECT floor(:at * count(*)) FROM nemesis_rows) LIMIT 1)"),
                {"at": rng.random()})
        self.done["rows deleted"] += found.rowcount
        self._stop.wait(rng.uniform(0.5, 1.5))

    # restock ------------------------------------------------------------------------------

    def _call(self, task: str, *args: Any) -> Any:
        try:
            return self.client.send_task(task, args=list(args)).get(timeout=15)
        except (TimeoutError, ConnectionError, OSError, RuntimeError):
            self.renew()
            raise

    def _orders(self, rng: random.Random) -> None:
        n = len(self.orders)
        order_id = f"nem-order-{n}"
        items = [[f"{order_id}-{k}", sku, rng.randint(1, 3)]
                 for k, sku in enumerate(rng.sample(sorted(SKUS), rng.randint(1, 2)))]
        member = f"member-{rng.randrange(8)}"
        self.orders[order_id] = (member, items)  # recorded before sending: heal re-sends it
        pay_after = rng.uniform(0, 6) if rng.random() < 0.5 else None
        self._call("tasks.restock.place_order", order_id, member, items)
        if pay_after is not None:
            timer = threading.Timer(pay_after, self._pay, args=(order_id,))
            self._timers.append(timer)
            timer.start()
        self._stop.wait(rng.uniform(0.2, 0.8))

    def _pay(self, order_id: str) -> None:
        try:
            self._call("tasks.restock.pay", order_id)
            self.done["payments"] += 1
        except Exception as exc:  # noqa: BLE001 - OrderExpired is an answer, not a failure
            self.errors[f"pay: {type(exc).__name__}"] += 1

    # sagas --------------------------------------------------------------------------------

    def _sagas(self, rng: random.Random) -> None:
        order_id = f"nem-saga-{len(self.sagas)}"
        fail_at = rng.choice(FAIL_AT)
        revoke_after = rng.uniform(0.2, 1.5) if rng.random() < 0.25 else None
        sent_at = round(time.monotonic() - self._t0, 2)
        task_id = str(uuid.UUID(int=rng.getrandbits(128)))
        # Recorded before it is sent: a send that fails after publishing is judged too (one
        # never published leaves an empty ledger, which is whole). No result is awaited.
        self.sagas.append(SagaSent(order_id, task_id, fail_at, sent_at, revoke_after is not None))
        self.client.send_task(SAGA, args=[order_id, fail_at, rng.uniform(0.1, 0.6)],
                              task_id=task_id, ignore_result=True)
        if revoke_after is not None:
            self._stop.wait(revoke_after)
            self.client.control.revoke(task_id, terminate=True)
        self._stop.wait(rng.uniform(0.3, 1.0))
