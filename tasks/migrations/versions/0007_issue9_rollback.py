"""Rollback journal and retention: (reserved for the guarantee-holes work of issue 9)

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
