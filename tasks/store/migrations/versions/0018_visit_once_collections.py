"""Visit-once range jobs and collections (issue 21): `range_runs.planned_at`, when a visit-once
run's plan was made (once per run, from the bounds read at that time); `range_run_input`, the
lines of a CSV job's run, keyed by (run, line); `work_items.collection_cursor`, a custom
collection's place (JSON text).

Revision ID: 0018
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0018"
down_revision = "0016"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("range_runs", "range_run_input", "work_items")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.add_column("range_runs", sa.Column("planned_at", sa.DateTime(), nullable=True))
    op.add_column("work_items", sa.Column("collection_cursor", sa.Text(), nullable=True))
    op.create_table(
        "range_run_input",
        sa.Column("run", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("line", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run", "line"),
    )


def downgrade() -> None:
    op.drop_table("range_run_input")
    with op.batch_alter_table("work_items") as batch:
        batch.drop_column("collection_cursor")
    with op.batch_alter_table("range_runs") as batch:
        batch.drop_column("planned_at")
