"""Settle order items a drain left 'released' although their stock is back.

A drain batch moves its items 'held' -> 'released' in the database (step 3 of
`tasks.restock.drain`), returns their stock in Redis with restock.lua (step 4), and records
them 'restocked' in the next batch's transaction or when the drain stops (step 5). A drainer
that loses Redis's reply to step 4, or dies before step 5, leaves items 'released' whose
entries restock.lua already consumed; nothing drains them again, so without this they stay
'released' for good (the nemesis found one: its order never settled). Their stock is right
either way ('released' and 'restocked' both count as returned, in the rebuild too); only their
record is behind.

The tick settles them: an item 'released' for longer than `grace` (a live drainer records its
batches well within a lease TTL) is 'restocked' once its entry

- is not in its queue's delay queue (else a drainer will restock it), and
- is not the item's deduction on record (whatever consumes an entry takes its record along;
  an entry still on record was never consumed), and
- was not dead-lettered (a dead letter holds an entry whose stock did not come back; the
  drainer writes the letter before it removes the entry, so a letter is found if the entry
  left that way).

An entry that left with a wipe of its shard is settled too: the rebuild that follows counts
the item as returned. Cost per tick: one indexed read of the items 'released' longer than
`grace` (normally none), then one Redis round trip per shard that has any.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletters.tables import DEAD_LETTERS
from tasks.restock.drain import DEAD_LETTER_KIND
from tasks.restock.keys import deducted_key, delay_key
from tasks.restock.shards import StockShard
from tasks.restock.tables import ORDER_ITEMS, ItemState
from tasks.store.db import affected, utcnow

__all__ = ["settle_released", "SETTLE_LIMIT"]

log = logging.getLogger("tasks.restock")

SETTLE_LIMIT = 500  # items looked at per tick; the rest wait for the next tick



def settle_released(sessions: sessionmaker[Session], shards: Sequence[StockShard],
                    grace: float) -> int:
    """Record as 'restocked' the items left 'released' whose stock is back; how many."""
    cutoff = utcnow() - timedelta(seconds=grace)
    with sessions() as session:
        rows = session.execute(
            select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.redis_id, ORDER_ITEMS.c.queue,
                   ORDER_ITEMS.c.entry)
            .where(ORDER_ITEMS.c.state == ItemState.RELEASED,
                   ORDER_ITEMS.c.updated_at < cutoff, ORDER_ITEMS.c.entry.is_not(None))
            .order_by(ORDER_ITEMS.c.updated_at).limit(SETTLE_LIMIT)).all()
    if not rows:
        return 0
    by_shard: dict[int, list[Any]] = defaultdict(list)
    for row in rows:
        by_shard[row.redis_id].append(row)
    consumed = [row for shard in shards for row in _consumed(shard, by_shard.get(shard.number))]
    settled = _not_lettered(sessions, consumed)
    if not settled:
        return 0
    with sessions.begin() as session:
        count = sum(affected(session.execute(
            update(ORDER_ITEMS).where(ORDER_ITEMS.c.order_item_id == row.order_item_id,
                                      ORDER_ITEMS.c.state == ItemState.RELEASED,
                                      ORDER_ITEMS.c.entry == row.entry)
            .values(state=ItemState.RESTOCKED, updated_at=utcnow()))) for row in settled)
    log.warning("restock: %d item(s) left 'released' by a drain that did not finish are "
                "restocked (their entries were consumed): %s", count,
                [row.order_item_id for row in settled[:10]])
    return count


def _consumed(shard: StockShard, rows: list[Any] | None) -> list[Any]:
    """The rows whose entry is neither queued nor on record on `shard` (one round trip)."""
    if not rows:
        return []
    number = shard.number
    with shard.client.pipeline(transaction=False) as pipe:
        for row in rows:
            pipe.zscore(delay_key(number, row.queue), row.entry)
            pipe.hget(deducted_key(number), row.order_item_id)
        found = pipe.execute()
    return [row for i, row in enumerate(rows)
            if found[2 * i] is None and _text(found[2 * i + 1]) != row.entry]


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _not_lettered(sessions: sessionmaker[Session], rows: list[Any]) -> list[Any]:
    """The rows whose entry has no restock dead letter (letters are keyed by the entry's
    first 255 characters)."""
    if not rows:
        return []
    refs = sorted({row.entry[:255] for row in rows})
    with sessions() as session:
        lettered = set(session.execute(select(DEAD_LETTERS.c.ref).where(
            DEAD_LETTERS.c.kind == DEAD_LETTER_KIND, DEAD_LETTERS.c.ref.in_(refs))).scalars())
    return [row for row in rows if row.entry[:255] not in lettered]
