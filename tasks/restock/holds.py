"""What the database recorded of a shard's deductions, against what the shard holds.

The database's generation of a shard (`recorded_generation`) is what deduct.lua compares the
shard with: a shard behind it lost recorded deductions and refuses (STALE) until rebuilt.

That check cannot see a deduction lost before it was recorded. Timeline of the window it
leaves, and how `take_back_lost` closes it::

    place_order p   deduct.lua: offset o, record on the shard     (p's process stalls)
    shard           restored: restarted empty and rebuilt, or put back to an older snapshot;
                    p's deduction is gone, and nothing says so: the database never saw o
    place_order q   deducts the same units again, is given offset o again, is paid
    place_order p   records p 'held' at offset o     -> without a check: both sold (20 of 10)
                    checks: p's deduction is not on record on the shard
                    -> p back to 'reserving' (compare-and-set on its entry), StockUnavailable:
                       the task's retry deducts p afresh (or rejects it: no stock left)

A deduction on record after p's record landed can only be lost by a later restore, which the
generation check catches: the database now knows offset o. A process that dies between
recording and checking leaves p 'held' unchecked; the check covers every held item of the
order, so the redelivered place_order (acks_late) finishes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.db import utcnow
from tasks.models import ORDER_ITEMS, RESTOCK_NODES, ItemState
from tasks.restock.keys import deducted_key
from tasks.restock.scripts import Generation, StockScripts

__all__ = ["LOST_DEDUCTION", "recorded_generation", "take_back_lost"]

# Why an item went back to 'reserving' after it was recorded held.
LOST_DEDUCTION = ("the stock node lost the deduction before it was recorded (restarted or "
                  "restored)")


def recorded_generation(session: Session, redis_id: int) -> Generation:
    """Node `redis_id`'s generation as the database recorded it: the term of its last rebuild
    and the highest offset any of its order items holds (0 when none)."""
    term = session.execute(select(RESTOCK_NODES.c.term)
                           .where(RESTOCK_NODES.c.redis_id == redis_id)).scalar()
    offset = session.execute(select(func.max(ORDER_ITEMS.c.redo_offset))
                             .where(ORDER_ITEMS.c.redis_id == redis_id)).scalar()
    return Generation(term=int(term or 0), offset=int(offset or 0))


def take_back_lost(sessions: sessionmaker[Session], nodes: Sequence[StockScripts],
                   order_id: str) -> list[str]:
    """Put every held item of order `order_id` whose shard holds no deduction on record for
    it (any entry of the item: a rebuild may have re-issued it) back to 'reserving'; return
    their ids. Redis errors propagate (nothing is taken back then)."""
    with sessions() as session:
        held = list(session.execute(
            select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.redis_id, ORDER_ITEMS.c.entry)
            .where(ORDER_ITEMS.c.order_id == order_id, ORDER_ITEMS.c.state == ItemState.HELD)
            .order_by(ORDER_ITEMS.c.order_item_id)))
    lost = []
    for node in sorted({row.redis_id for row in held}):
        rows = [row for row in held if row.redis_id == node]
        records = nodes[node].client.hmget(deducted_key(node), [r.order_item_id for r in rows])
        lost += [row for row, record in zip(rows, records, strict=True) if record is None]
    if not lost:
        return []
    with sessions.begin() as session:
        for row in lost:
            # The entry guards against a rebuild's re-issue or a release landing meanwhile.
            session.execute(
                update(ORDER_ITEMS)
                .where(ORDER_ITEMS.c.order_item_id == row.order_item_id,
                       ORDER_ITEMS.c.state == ItemState.HELD, ORDER_ITEMS.c.entry == row.entry)
                .values(state=ItemState.RESERVING, entry=None, time_ms=0,
                        reason=LOST_DEDUCTION, updated_at=utcnow()))
    return [row.order_item_id for row in lost]
