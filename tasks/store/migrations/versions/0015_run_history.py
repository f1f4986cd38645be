"""Run history that stays true on re-runs (issue 21): `range_runs.number` (the job's run 1, 2,
3..., unique per job), `started_by` and `skipped` (rows still quarantined when the run ended);
`work_items.rows_skipped` (the current run's quarantined rows of a partition). Older runs get
their numbers in id order per job and their starter from their first `start` event.

Revision ID: 0015
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

from tasks.store.migrations.gate import wanted

revision = "0015"
down_revision = "0017"
branch_labels = None
depends_on = None
# The ranges wing's tables: created only while the wing is enabled (WINGS), and
# replayed by the first `migrate` after it is turned on (tasks/store/migrations/gate.py).
TABLES = ("range_runs", "range_run_events", "work_items")


def upgrade() -> None:
    if not wanted(TABLES):
        return
    op.add_column("range_runs", sa.Column("number", sa.Integer(), nullable=True))
    op.add_column("range_runs", sa.Column("started_by", sa.String(255), nullable=True))
    op.add_column("range_runs", sa.Column("skipped", sa.BigInteger(), nullable=False,
                                          server_default="0"))
    op.add_column("work_items", sa.Column("rows_skipped", sa.BigInteger(), nullable=False,
                                          server_default="0"))
    conn = op.get_bind()
    runs = sa.table("range_runs", sa.column("id", sa.Integer()), sa.column("job", sa.String()),
                    sa.column("number", sa.Integer()), sa.column("started_by", sa.String()))
    events = sa.table("range_run_events", sa.column("id", sa.Integer()),
                      sa.column("run_id", sa.Integer()), sa.column("verb", sa.String()),
                      sa.column("actor", sa.String()))
    # In Python, one row at a time: MariaDB refuses an UPDATE whose subquery reads the table
    # it updates, and a job has few runs.
    seen: dict[str, int] = {}
    for run_id, job in conn.execute(sa.select(runs.c.id, runs.c.job).order_by(runs.c.id)).all():
        seen[job] = seen.get(job, 0) + 1
        starter = conn.execute(sa.select(events.c.actor).where(
            events.c.run_id == run_id, events.c.verb == "start")
            .order_by(events.c.id).limit(1)).scalar()
        conn.execute(sa.update(runs).where(runs.c.id == run_id).values(
            number=seen[job], started_by=starter))
    with op.batch_alter_table("range_runs") as batch:  # SQLite: the table is copied
        batch.create_unique_constraint("uq_range_runs_job_number", ["job", "number"])


def downgrade() -> None:
    with op.batch_alter_table("range_runs") as batch:
        batch.drop_constraint("uq_range_runs_job_number", type_="unique")
        batch.drop_column("skipped")
        batch.drop_column("started_by")
        batch.drop_column("number")
    with op.batch_alter_table("work_items") as batch:
        batch.drop_column("rows_skipped")
