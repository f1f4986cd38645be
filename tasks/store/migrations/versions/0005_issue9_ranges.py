"""Range jobs: a crash count per partition (poison partitions fail past the redelivery cap)
and the time a finished partition's late-commit check ran.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("work_items", sa.Column("crashes", sa.Integer(), nullable=False,
                                          server_default="0"))
    op.add_column("work_items", sa.Column("settled_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("work_items") as batch:
        batch.drop_column("settled_at")
        batch.drop_column("crashes")
