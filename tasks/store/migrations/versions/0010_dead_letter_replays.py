"""Dead letters: when a letter was replayed and the task id it was sent under, so
`python -m tasks deadletters replay` refuses a second replay of the same letter.

Revision ID: 0010
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dead_letters", sa.Column("replayed_at", sa.DateTime(), nullable=True))
    op.add_column("dead_letters", sa.Column("replay_task_id", sa.String(255), nullable=True))
    # `purge --older-than` and the retention prune select by age.
    op.create_index("ix_dead_letters_created_at", "dead_letters", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_dead_letters_created_at", "dead_letters")
    with op.batch_alter_table("dead_letters") as batch:
        batch.drop_column("replay_task_id")
        batch.drop_column("replayed_at")
