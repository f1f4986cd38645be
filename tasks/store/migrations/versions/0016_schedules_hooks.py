"""Range jobs' cron schedules (`range_job_schedules`) and the hooks' outbox on their runs
(`range_runs.hook`, `hook_task`, `hook_sent_at`; issue 21).

Revision ID: 0016
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0016"
down_revision = "0014"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("range_runs", "range_job_schedules")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.add_column("range_runs", sa.Column("hook", sa.String(16), nullable=True))
    op.add_column("range_runs", sa.Column("hook_task", sa.String(64), nullable=True))
    op.add_column("range_runs", sa.Column("hook_sent_at", sa.DateTime(), nullable=True))
    op.create_index("ix_range_runs_hook", "range_runs", ["hook"])
    op.create_table(
        "range_job_schedules",
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("cron", sa.String(128), nullable=True),
        sa.Column("policy", sa.String(16), nullable=False),
        sa.Column("missed", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("next_due_at", sa.DateTime(), nullable=True),
        sa.Column("queued_due_at", sa.DateTime(), nullable=True),
        sa.Column("last_due_at", sa.DateTime(), nullable=True),
        sa.Column("last_outcome", sa.String(255), nullable=True),
        sa.Column("fired", sa.BigInteger(), nullable=False),
        sa.Column("skipped", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("range_job_schedules")
    op.drop_index("ix_range_runs_hook", "range_runs")
    with op.batch_alter_table("range_runs") as batch:
        batch.drop_column("hook_sent_at")
        batch.drop_column("hook_task")
        batch.drop_column("hook")
