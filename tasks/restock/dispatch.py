"""Beat's one restock message per tick: what every shard needs now, sent only where due.

Beat emits ``tasks.restock.tick`` once per RESTOCK_INTERVAL (not a sync, drain and rebuild per
shard and queue: with 16 shards and 2 queues that would be 80 messages a tick, most of them
finding nothing to do). The tick, one task:

1. syncs every shard's queues inline (sync.lua: redo log -> delay queue, a cheap script call
   that is refused during maintenance and idempotent);
2. reads, in one pipeline per master, each queue's due count (ZCOUNT up to the master's own
   clock) and each shard's term, offset counter, stock size and maintenance schedule;
3. reads the database's side of every shard in three queries (terms, highest offsets, SKU
   counts), and
4. sends ``tasks.restock.drain(shard, queue)`` for each queue with due entries and
   ``tasks.restock.rebuild(shard)`` for each shard whose window is due or that is behind the
   database (the rebuild task checks again under its lease).

Every message it sends is idempotent and guarded by the shard's scripts and leases, so a
duplicate tick (two beats, a redelivery) only sends duplicates that change nothing.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from tasks.restock.holds import behind_database
from tasks.restock.keys import delay_key, meta_key, offset_key, stock_key, term_key
from tasks.restock.scripts import Generation
from tasks.restock.shards import StockShard
from tasks.restock.tables import ORDER_ITEMS, RESTOCK_NODES, SKUS

__all__ = ["DueWork", "due_work"]

log = logging.getLogger("tasks.restock")


@dataclass
class DueWork:
    """What one tick found: the queues to drain and the shards to rebuild."""

    drains: list[tuple[int, str]] = field(default_factory=list)
    rebuilds: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"drains": [list(d) for d in self.drains], "rebuilds": self.rebuilds}


@dataclass(frozen=True)
class _Recorded:
    """The database's side of every shard (shard -> value; missing: 0)."""

    terms: dict[int, int]
    offsets: dict[int, int]
    skus: dict[int, int]


def _recorded(sessions: sessionmaker[Session]) -> _Recorded:
    with sessions() as session:
        terms = {r[0]: int(r[1] or 0) for r in session.execute(
            select(RESTOCK_NODES.c.redis_id, RESTOCK_NODES.c.term))}
        offsets = {r[0]: int(r[1] or 0) for r in session.execute(
            select(ORDER_ITEMS.c.redis_id, func.max(ORDER_ITEMS.c.redo_offset))
            .group_by(ORDER_ITEMS.c.redis_id))}
        skus = {r[0]: int(r[1]) for r in session.execute(
            select(SKUS.c.redis_id, func.count()).group_by(SKUS.c.redis_id))}
    return _Recorded(terms, offsets, skus)


def _by_client(shards: Sequence[StockShard]) -> list[list[StockShard]]:
    """The shards grouped by the client that serves them (one group per master)."""
    groups: dict[int, list[StockShard]] = defaultdict(list)
    for shard in shards:
        groups[id(shard.client)].append(shard)
    return list(groups.values())


def _read_group(group: list[StockShard], queues: Sequence[str]) -> list[list[Any]]:
    """Per shard of one client: [term, offset, stock size, next window, due per queue...]."""
    now = group[0].now_ms()
    with group[0].client.pipeline(transaction=False) as pipe:
        for shard in group:
            n = shard.number
            pipe.get(term_key(n))
            pipe.get(offset_key(n))
            pipe.hlen(stock_key(n))
            pipe.hget(meta_key(n), "next_maintain_ms")
            for queue in queues:
                pipe.zcount(delay_key(n, queue), "-inf", now)
        replies = pipe.execute()
    width = 4 + len(queues)
    rows = [replies[i * width:(i + 1) * width] for i in range(len(group))]
    return [[*row[:3], None if row[3] is None else int(row[3]) <= now, *row[4:]]
            for row in rows]


def due_work(sessions: sessionmaker[Session], shards: Sequence[StockShard],
             queues: Sequence[str]) -> DueWork:
    """The drains and rebuilds due now on `shards` (their queues synced first, see above)."""
    recorded = _recorded(sessions)
    work = DueWork()
    for group in _by_client(shards):
        try:
            rows = _read_group(group, queues)
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # the master is away
            log.warning("tick: shards %s unreadable: %s", [n.number for n in group], exc)
            continue
        for shard, row in zip(group, rows, strict=True):
            n = shard.number
            term, offset, stocked, window_due, dues = row[0], row[1], row[2], row[3], row[4:]
            known = Generation(recorded.terms.get(n, 0), recorded.offsets.get(n, 0))
            behind = behind_database(term, offset, stocked, known, recorded.skus.get(n, 0))
            if window_due is None or window_due or behind:
                work.rebuilds.append(n)
            work.drains += [(n, q) for q, due in zip(queues, dues, strict=True) if int(due)]
    work.drains.sort()
    work.rebuilds.sort()
    return work
