"""What the database recorded of a shard's deductions, against what the shard holds.

The database's generation of a shard (`recorded_generation`) is what deduct.lua compares the
shard with: a shard behind it lost recorded deductions and refuses (STALE) until rebuilt.

That comparison cannot see a deduction lost before it was recorded, nor one an order in
flight could not know about yet. Timeline of the window, and how `check_holds` closes it::

    place_order p   deduct.lua: offset o, record on the shard     (p's process stalls)
    shard           restored: restarted empty and rebuilt, or put back to an older snapshot;
                    p's deduction is gone, and nothing looks stale: the database never saw o
    place_order q   deducts the same units again, is given offset o again, is paid
    place_order p   records p 'held' at offset o     -> unchecked: both sold (20 of 10)
                    checks: p's deduction is not on record on the shard
                    -> p back to 'reserving' (compare-and-set on its entry), StockUnavailable:
                       the task's retry deducts p afresh (or rejects it: no stock left)

The other order of events: p records and checks, then the restore lands while an order q
that read the generation before p's record was still deducting. q is given offset o again
and records it; its check finds p at its offset without a record on the shard, so the shard
handed o out twice. p goes back to 'reserving' (its place_order, called again, deducts
afresh; `pay` says OrderPending meanwhile), or, if p was paid already, q is rejected and the
shard is marked stale (a recorded term above its own: deductions refuse and the next tick
rebuilds it from the database, without q). A restore after both records is the generation's
case. Every call checks every held item of its order, so a redelivered place_order finishes
the check of a process that died after recording.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.restock.keys import deducted_key, term_key
from tasks.restock.scripts import Generation, StockScripts
from tasks.restock.tables import ORDER_ITEMS, RESTOCK_NODES, ItemState
from tasks.store.db import WRITE_INTENT, utcnow

__all__ = ["LOST_DEDUCTION", "SOLD_BEFORE", "behind_database", "check_holds",
           "recorded_generation"]

log = logging.getLogger("tasks.restock")

# Why an item recorded held went back to 'reserving'.
LOST_DEDUCTION = ("the stock shard lost the deduction before it was recorded (restarted or "
                  "restored)")
# Why an item recorded held was rejected.
SOLD_BEFORE = ("the stock shard lost a paid deduction and sold its units again to this item "
               "(restored while it was placed): rejected, the shard is rebuilt")


def recorded_generation(session: Session, redis_id: int) -> Generation:
    """Shard `shard`'s generation as the database recorded it: the term of its last rebuild
    and the highest offset any of its order items holds (0 when none)."""
    term = session.execute(select(RESTOCK_NODES.c.term)
                           .where(RESTOCK_NODES.c.redis_id == redis_id)).scalar()
    offset = session.execute(select(func.max(ORDER_ITEMS.c.redo_offset))
                             .where(ORDER_ITEMS.c.redis_id == redis_id)).scalar()
    return Generation(term=int(term or 0), offset=int(offset or 0))


def behind_database(term: Any, offset: Any, stocked: Any, known: Generation,
                    skus: int) -> bool:
    """The one rule of a shard behind the database (it lost writes; a rebuild levels it): its
    term or offset counter is older than `known`, the generation the database recorded, or
    its stock hash holds fewer SKUs (`stocked`) than the database has on it (`skus`). `term`
    and `offset` are the shard's replies as read (None: never set)."""
    return (int(term or 0) < known.term or int(offset or 0) < known.offset
            or int(stocked) < skus)


def check_holds(sessions: sessionmaker[Session], shards: Sequence[StockScripts],
                order_id: str) -> list[str]:
    """Check every held item of order `order_id` against its shard (module doc); return the
    ids of those taken back to 'reserving' or rejected. Redis errors propagate (nothing is
    changed then)."""
    held = _items(sessions, (ItemState.HELD,), ORDER_ITEMS.c.order_id == order_id)
    back: list[Any] = []  # to 'reserving'
    rejected: list[Any] = []
    for shard in sorted({row.redis_id for row in held}):
        rows = [row for row in held if row.redis_id == shard]
        gone = _off_record(shards[shard], shard, rows)
        back += gone
        kept = [row for row in rows if row not in gone]
        for rival in _off_record(shards[shard], shard, _same_offsets(sessions, shard, kept)):
            if rival.state == ItemState.HELD:
                back.append(rival)
                continue
            log.error("shard %d lost paid item %s and sold offset %d again: marked stale",
                      shard, rival.order_item_id, rival.redo_offset)
            _mark_stale(sessions, shards[shard], shard)
            rejected += [row for row in kept if row.redo_offset == rival.redo_offset]
    _set_state(sessions, back, ItemState.RESERVING, LOST_DEDUCTION)
    _set_state(sessions, rejected, ItemState.REJECTED, SOLD_BEFORE)
    return sorted({row.order_item_id for row in back + rejected if row.order_id == order_id})


def _items(sessions: sessionmaker[Session], states: tuple[str, ...],
           *where: ColumnElement[bool]) -> list[Any]:
    with sessions() as session:
        return list(session.execute(
            select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.order_id, ORDER_ITEMS.c.redis_id,
                   ORDER_ITEMS.c.entry, ORDER_ITEMS.c.redo_offset, ORDER_ITEMS.c.state)
            .where(ORDER_ITEMS.c.state.in_(states), *where)
            .order_by(ORDER_ITEMS.c.order_item_id)))


def _off_record(scripts: StockScripts, shard: int, rows: list[Any]) -> list[Any]:
    """The rows whose item has no deduction on record on `shard` (any entry of the item: a
    rebuild may have re-issued it)."""
    if not rows:
        return []
    records = scripts.client.hmget(deducted_key(shard), [row.order_item_id for row in rows])
    return [row for row, record in zip(rows, records, strict=True) if record is None]


def _same_offsets(sessions: sessionmaker[Session], shard: int, rows: list[Any]) -> list[Any]:
    """Other held or paid items of `shard` recorded at the offsets of `rows`."""
    offsets = [row.redo_offset for row in rows if row.redo_offset is not None]
    if not offsets:
        return []
    return _items(sessions, (ItemState.HELD, ItemState.PAID),
                  ORDER_ITEMS.c.redis_id == shard, ORDER_ITEMS.c.redo_offset.in_(offsets),
                  ORDER_ITEMS.c.order_item_id.not_in([row.order_item_id for row in rows]))


def _set_state(sessions: sessionmaker[Session], rows: list[Any], state: str, reason: str
               ) -> None:
    """Compare-and-set each held row (its entry unchanged: no re-issue or release landed
    meanwhile) to `state`."""
    if not rows:
        return
    with sessions.begin() as session:
        for row in rows:
            session.execute(
                update(ORDER_ITEMS)
                .where(ORDER_ITEMS.c.order_item_id == row.order_item_id,
                       ORDER_ITEMS.c.state == ItemState.HELD, ORDER_ITEMS.c.entry == row.entry)
                .values(state=state, entry=None, time_ms=0, reason=reason,
                        updated_at=utcnow()))


def _mark_stale(sessions: sessionmaker[Session], scripts: StockScripts, shard: int) -> None:
    """Record a term above the shard's own: deduct.lua refuses (STALE) and the next tick
    rebuilds the shard from the database."""
    term = int(scripts.client.get(term_key(shard)) or 0) + 1
    with sessions.begin() as session:
        session.connection(execution_options=WRITE_INTENT)
        stored = session.execute(select(RESTOCK_NODES.c.term)
                                 .where(RESTOCK_NODES.c.redis_id == shard)).scalar()
        if stored is None:
            session.execute(insert(RESTOCK_NODES).values(redis_id=shard, term=term))
        elif stored < term:
            session.execute(update(RESTOCK_NODES).where(RESTOCK_NODES.c.redis_id == shard)
                            .values(term=term))
