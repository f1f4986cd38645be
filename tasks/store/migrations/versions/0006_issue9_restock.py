"""Restock: the node generation in the database, and the rebuild's aggregate reads.

- order_items.redo_offset: each deduction's offset on its node; max(redo_offset) per node is the
  database's side of the node's generation (deduct.lua refuses while the node is behind it).
- ix_order_items_node_offset (redis_id, redo_offset): that max, by index.
- ix_order_items_sku_state (sku_id, state, qty): the rebuild's per-SKU sums of paid and held
  stock, read in chunks of SKUs without scanning every item of the node.
- Every node's term + 1: offsets became one counter per node (they were per queue), so each
  existing node must be rebuilt once (its term is now behind the database: it refuses
  deductions, is due at once, and the rebuild starts the new offsets).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
# The restock wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("order_items", "restock_nodes")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.add_column("order_items", sa.Column("redo_offset", sa.BigInteger(), nullable=True))
    op.create_index("ix_order_items_node_offset", "order_items", ["redis_id", "redo_offset"])
    op.create_index("ix_order_items_sku_state", "order_items", ["sku_id", "state", "qty"])
    nodes = sa.table("restock_nodes", sa.column("term", sa.BigInteger()))
    op.execute(nodes.update().values(term=nodes.c.term + 1))


def downgrade() -> None:
    op.drop_index("ix_order_items_sku_state", "order_items")
    op.drop_index("ix_order_items_node_offset", "order_items")
    op.drop_column("order_items", "redo_offset")
