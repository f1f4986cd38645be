"""Range runs end on a closing round: when the job's last closing read began, and an index
that tells whether any partition of a job is still open, and the fence floor of a re-plan.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("schedules", "work_items")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.add_column("schedules", sa.Column("closed_at", sa.DateTime(), nullable=True))
    op.add_column("schedules", sa.Column("fence_floor", sa.BigInteger(), nullable=False,
                                         server_default="0"))
    op.create_index("ix_work_items_job_status", "work_items", ["kind", "job", "status"])


def downgrade() -> None:
    op.drop_index("ix_work_items_job_status", "work_items")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("fence_floor")
        batch.drop_column("closed_at")
