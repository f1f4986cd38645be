"""The claim of the next pending partition reads an index in partition order: `(kind, job,
status, part)` replaces `(kind, job, status)`, so `... WHERE status = 'pending' ORDER BY part
LIMIT n` stops after n rows instead of sorting every pending partition (30 ms a claim on
PostgreSQL at 100,000 pending partitions, a sort spilled to disk). The new index serves every
query the old one did (it has the old one's columns as its prefix).

Revision ID: 0014
Revises: 0013
"""

from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("work_items",)


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.create_index("ix_work_items_job_status_part", "work_items",
                    ["kind", "job", "status", "part"])
    op.drop_index("ix_work_items_job_status", "work_items")


def downgrade() -> None:
    op.create_index("ix_work_items_job_status", "work_items", ["kind", "job", "status"])
    op.drop_index("ix_work_items_job_status_part", "work_items")
