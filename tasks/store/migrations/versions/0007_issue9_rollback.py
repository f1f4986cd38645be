"""Rollback journal owners and retention.

`rollback_owners` holds one row per journal: the owning execution's lease token and a state.
Every write the owner makes matches that row in the same transaction, so the sweeper's
takeover (a compare-and-set on it) fences out an owner that is still alive. The two indexes
serve the sweeper's scans: open owners, and finished rows past JOURNAL_RETENTION.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
# The rollback wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("rollback_owners", "rollback_journal")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.create_table(
        "rollback_owners",
        sa.Column("task_id", sa.String(255), primary_key=True),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_rollback_owners_state_updated", "rollback_owners",
                    ["state", "updated_at"])
    op.create_index("ix_rollback_journal_state_updated", "rollback_journal",
                    ["state", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_rollback_journal_state_updated", "rollback_journal")
    op.drop_index("ix_rollback_owners_state_updated", "rollback_owners")
    op.drop_table("rollback_owners")
