"""Range runs carry their parameters: `range_runs.params`, JSON text, null for a job that
takes none (issue 21).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("range_runs",)


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.add_column("range_runs", sa.Column("params", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("range_runs") as batch:
        batch.drop_column("params")
