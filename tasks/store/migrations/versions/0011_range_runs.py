"""Range-job controls: the runs of a range job and the audit of every control
(`range_runs`, `range_run_events`), and the time a partition waits for its throttle.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("range_runs", "range_run_events", "work_items")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.create_table(
        "range_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("rows_base", sa.BigInteger(), nullable=False),
        sa.Column("rows_per_s", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_range_runs_job", "range_runs", ["job"])
    op.create_table(
        "range_run_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("verb", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_range_run_events_run_id", "range_run_events", ["run_id"])
    op.add_column("work_items", sa.Column("throttled_until", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("work_items") as batch:
        batch.drop_column("throttled_until")
    op.drop_index("ix_range_run_events_run_id", "range_run_events")
    op.drop_table("range_run_events")
    op.drop_index("ix_range_runs_job", "range_runs")
    op.drop_table("range_runs")
