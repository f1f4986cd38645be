"""Visit-once range jobs (issue 21): `range_runs.planned_at`, when the run's plan was made (a
visit-once job's plan is made once per run, from the bounds read at that time).

Revision ID: 0018
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("range_runs", sa.Column("planned_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("range_runs") as batch:
        batch.drop_column("planned_at")
