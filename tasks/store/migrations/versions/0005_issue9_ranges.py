"""Range jobs: a crash count per partition (poison partitions fail past the redelivery cap)
and the time a finished partition's late-commit check ran.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("work_items",)


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.add_column("work_items", sa.Column("crashes", sa.Integer(), nullable=False,
                                          server_default="0"))
    op.add_column("work_items", sa.Column("settled_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("work_items") as batch:
        batch.drop_column("settled_at")
        batch.drop_column("crashes")
