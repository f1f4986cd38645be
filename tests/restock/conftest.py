"""Restock fixtures: two real redis-server nodes (or any clients: a Redis Cluster), a fresh
database, and a fake clock that stands for the nodes' own clock (Redis TIME), shared by every
shop, drainer and rebuilder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from tasks.restock.drain import Drainer
from tasks.restock.keys import deducted_key, stock_key
from tasks.restock.maintenance import Rebuilder
from tasks.restock.routing import Router
from tasks.restock.settings import RestockSettings
from tasks.restock.shards import StockShard, close_shards, connect_shards
from tasks.restock.shop import Shop
from tasks.restock.tables import ORDER_ITEMS, SKUS, ItemState
from tests.support.db import fresh_database
from tests.support.redis_server import RedisServer

T0 = 1_700_000_000_000
DELAY_MS = 10_000
QUEUES = 2


class FakeClockMs:
    """The stock nodes' clock in milliseconds, moving only when told to."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@dataclass
class World:
    """A shop on two Redis nodes, with one drainer and one rebuilder per shard.

    By default one shard per server (shard i on server i); `shards` and `make_clients` put
    that many shards on the clients it returns (shard N on client N % clients), e.g. one
    RedisCluster client for every shard.
    """

    sessions: sessionmaker[Session]
    servers: list[RedisServer]
    clock: FakeClockMs
    capacity: int = 100_000
    shards: int = 0  # 0: one per server
    make_clients: Callable[[], list[Any]] | None = None
    nodes: list[StockShard] = field(default_factory=list)
    shop: Shop = field(init=False)
    drainers: list[Drainer] = field(default_factory=list)
    rebuilders: list[Rebuilder] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The queue names by the platform's one rule (RestockSettings.queue_names).
        queues = RestockSettings(queues=QUEUES).queue_names
        self.router = Router(shards=self.shards or len(self.servers), queues=queues)
        self.connect()

    def connect(self) -> None:
        close_shards(self.nodes)
        clients = self.make_clients() if self.make_clients else [
            redis.Redis(port=s.port, socket_timeout=0.5, socket_connect_timeout=0.5)
            for s in self.servers]
        self.nodes = connect_shards(clients, self.router.shards, clock=self.clock)
        self.shop = Shop(self.sessions, [n.scripts for n in self.nodes], self.router)
        self.drainers = [Drainer(self.sessions, n, batch=7, delay_ms=DELAY_MS,
                                 capacity=self.capacity, lease_ttl=2.0)
                         for n in self.nodes]
        self.rebuilders = [Rebuilder(self.sessions, n, self.router.queues,
                                     every_ms=3_600_000, lease_ttl=2.0, chunk=5)
                           for n in self.nodes]

    def close(self) -> None:
        close_shards(self.nodes)

    def settle(self) -> None:
        """Sync and drain every queue of every node once."""
        for drainer in self.drainers:
            for queue in self.router.queues:
                drainer.sync(queue)
                drainer.drain(queue)

    def rebuild_all(self) -> None:
        for rebuilder in self.rebuilders:
            rebuilder.rebuild(force=True)

    def stock(self, sku: str) -> int | None:
        node = self.router.shard_for(sku)
        raw = self.nodes[node].client.hget(stock_key(node), sku)
        return None if raw is None else int(raw)

    def qty(self, sku: str, *states: str) -> int:
        with self.sessions() as session:
            return int(session.execute(
                select(func.coalesce(func.sum(ORDER_ITEMS.c.qty), 0))
                .where(ORDER_ITEMS.c.sku_id == sku, ORDER_ITEMS.c.state.in_(states))).scalar()
                or 0)

    def totals(self) -> dict[str, int]:
        with self.sessions() as session:
            return {r.sku_id: int(r.total) for r in session.execute(select(SKUS))}

    def reserved_on_record(self, sku: str) -> int:
        """Quantity of the SKU's 'reserving' items whose deduction did happen in Redis."""
        node = self.router.shard_for(sku)
        with self.sessions() as session:
            rows = list(session.execute(select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.qty)
                                        .where(ORDER_ITEMS.c.sku_id == sku,
                                               ORDER_ITEMS.c.state == ItemState.RESERVING)))
        if not rows:
            return 0
        records = self.nodes[node].client.hmget(deducted_key(node), [r[0] for r in rows])
        return sum(r[1] for r, record in zip(rows, records, strict=True) if record)

    def check_conserved(self) -> None:
        """At a quiet moment: free + held + paid == total, for every SKU, never negative."""
        for sku, total in self.totals().items():
            free = self.stock(sku)
            assert free is not None and free >= 0, (sku, free)
            held = self.qty(sku, ItemState.HELD) + self.reserved_on_record(sku)
            paid = self.qty(sku, ItemState.PAID)
            assert free + held + paid == total, (sku, free, held, paid, total)


@pytest.fixture
def restock_engine(db_url: str) -> Iterator[Engine]:
    """A fresh database of each kind (SQLite, PostgreSQL, MariaDB)."""
    engine = fresh_database(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def two_nodes() -> Iterator[list[RedisServer]]:
    servers = [RedisServer().start(), RedisServer().start()]
    yield servers
    for server in servers:
        server.kill()


@pytest.fixture
def world(restock_engine: Engine, two_nodes: list[RedisServer]) -> Iterator[World]:
    w = World(sessionmaker(restock_engine, expire_on_commit=False), two_nodes, FakeClockMs())
    yield w
    w.close()
