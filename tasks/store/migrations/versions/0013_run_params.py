"""Range runs carry their parameters: `range_runs.params`, JSON text, null for a job that
takes none (issue 21).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("range_runs", sa.Column("params", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("range_runs") as batch:
        batch.drop_column("params")
