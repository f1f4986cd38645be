"""The restock wing's tables, on the shared `tasks.store.models.Base.metadata`:

    skus, orders, order_items, payments, restock_nodes

Migrations 0004 and 0006 create them, never `create_all`.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import BigInteger, DateTime, Integer, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from tasks.store.db import utcnow
from tasks.store.models import Base

__all__ = ["ItemState", "Sku", "Order", "OrderItem", "Payment", "RestockNode",
           "SKUS", "ORDERS", "ORDER_ITEMS", "PAYMENTS", "RESTOCK_NODES"]


class ItemState:
    """The life of an order item's stock. Only `reserving -> held -> paid`, `held -> released
    -> restocked` and `reserving -> held | released | rejected` happen; each step is a
    compare-and-set on the old state, so a payment and a restock never both win."""

    RESERVING = "reserving"  # recorded; the Redis deduction may or may not have happened
    HELD = "held"  # deducted in Redis, waiting for payment
    PAID = "paid"  # paid: its stock is sold
    RELEASED = "released"  # unpaid past the delay: the drainer gives the stock back
    RESTOCKED = "restocked"  # the stock is back in Redis
    REJECTED = "rejected"  # Redis refused the deduction (not enough stock): holds nothing

    # States whose stock is out of Redis: the rebuild subtracts them from the total.
    OUT = (HELD, PAID)
    RETURNED = (RELEASED, RESTOCKED)


class Sku(Base):
    """A SKU and its total stock: the source of truth the rebuild recomputes Redis from."""

    __tablename__ = "skus"

    sku_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    redis_id: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Order(Base):
    __tablename__ = "orders"

    order_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    member_id: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class OrderItem(Base):
    """One line of an order: `qty` of `sku_id`, deducted on node `redis_id` into `queue`."""

    __tablename__ = "order_items"

    order_item_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    order_id: Mapped[str] = mapped_column(String(128), index=False)
    sku_id: Mapped[str] = mapped_column(String(128))
    qty: Mapped[int] = mapped_column(Integer)
    redis_id: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default=ItemState.RESERVING)
    # The deduction's time on its stock node's clock (Redis TIME), from which its delay runs;
    # 0 until the deduction is recorded.
    time_ms: Mapped[int] = mapped_column(BigInteger)
    entry: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The entry's offset on its node (None until deducted): the database's side of the node's
    # generation, so a node that comes back behind it refuses deductions (migration 0006).
    redo_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Payment(Base):
    __tablename__ = "payments"

    order_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    paid_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RestockNode(Base):
    """A logical stock shard's term (``redis_id`` is the shard number, a name from before
    shards), kept in the database so it only grows even when the shard's Redis restarts
    empty."""

    __tablename__ = "restock_nodes"

    redis_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    term: Mapped[int] = mapped_column(BigInteger, default=0)
    rebuilt_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    next_maintain_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


# The tables, for compare-and-set UPDATEs and bulk reads.
SKUS = cast(Table, Sku.__table__)
ORDERS = cast(Table, Order.__table__)
ORDER_ITEMS = cast(Table, OrderItem.__table__)
PAYMENTS = cast(Table, Payment.__table__)
RESTOCK_NODES = cast(Table, RestockNode.__table__)
