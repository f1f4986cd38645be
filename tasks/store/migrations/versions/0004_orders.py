"""Restock: SKUs and their total stock, orders, order items, payments, Redis node terms.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
# The restock wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("skus", "orders", "order_items", "payments", "restock_nodes")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.create_table(
        "skus",
        sa.Column("sku_id", sa.String(128), primary_key=True),
        sa.Column("redis_id", sa.Integer(), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "orders",
        sa.Column("order_id", sa.String(128), primary_key=True),
        sa.Column("member_id", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "order_items",
        sa.Column("order_item_id", sa.String(128), primary_key=True),
        sa.Column("order_id", sa.String(128), nullable=False),
        sa.Column("sku_id", sa.String(128), nullable=False),
        sa.Column("qty", sa.Integer(), nullable=False),
        sa.Column("redis_id", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("time_ms", sa.BigInteger(), nullable=False),
        sa.Column("entry", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_order_items_order", "order_items", ["order_id"])
    # The rebuild's scan: a node's items by state.
    op.create_index("ix_order_items_node_state", "order_items", ["redis_id", "state"])
    op.create_table(
        "payments",
        sa.Column("order_id", sa.String(128), primary_key=True),
        sa.Column("paid_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "restock_nodes",
        sa.Column("redis_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("rebuilt_at", sa.DateTime(), nullable=True),
        sa.Column("next_maintain_at", sa.DateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("restock_nodes")
    op.drop_table("payments")
    op.drop_index("ix_order_items_node_state", "order_items")
    op.drop_index("ix_order_items_order", "order_items")
    op.drop_table("order_items")
    op.drop_table("orders")
    op.drop_table("skus")
