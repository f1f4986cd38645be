"""Rollback journal: the checkpoints of running tasks and the state of their compensations.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
# The rollback wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("rollback_journal",)


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.create_table(
        "rollback_journal",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("compensation", sa.String(255), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("task_id", "seq", name="uq_rollback_journal_task_seq"),
    )
    # The sweeper's scan: recorded rows, grouped by task.
    op.create_index("ix_rollback_journal_state_task", "rollback_journal", ["state", "task_id"])


def downgrade() -> None:
    op.drop_index("ix_rollback_journal_state_task", "rollback_journal")
    op.drop_table("rollback_journal")
