"""Range jobs over any ordered unique key: a keyed job's partition stores its key bounds and
the cursor of its keyset pass as JSON text beside the integer `lo`, `hi` and `next_id`
(which then count rows, for progress). NULL for jobs keyed by one integer column.

Revision ID: 0017
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0017"
down_revision = "0018"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("work_items",)


def upgrade() -> None:
    if not wanted(TABLES):
        return
    for name in ("lo_key", "hi_key", "next_key"):
        op.add_column("work_items", sa.Column(name, sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("work_items") as batch:
        batch.drop_column("next_key")
        batch.drop_column("hi_key")
        batch.drop_column("lo_key")
