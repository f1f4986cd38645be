"""Work table and schedule table.

The example job's table cm_data was created here too until the example became a user's project
(examples/tables.py creates it now); a database migrated before keeps its table, which no
migration drops (docs/decisions.md, "The example as a user's project").

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("work_items", "schedules")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.create_table(
        "work_items",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("lo", sa.BigInteger(), nullable=False),
        sa.Column("hi", sa.BigInteger(), nullable=False),
        sa.Column("next_id", sa.BigInteger(), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("claims", sa.Integer(), nullable=False),
        sa.Column("rows_done", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.UniqueConstraint("kind", "job", "part", name="uq_work_items_job_part"),
    )
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("next_run_at", sa.DateTime(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("schedules")
    op.drop_table("work_items")
