"""The one MetaData (`Base.metadata`) every table of the platform is declared on.

Each table lives with its owner and registers itself here when its module is imported:

    work_items, schedules, range_runs, range_run_events,   tasks.ranges.tables
    range_run_input
    skus, orders, order_items, payments, restock_nodes      tasks.restock.tables
    rollback_journal, rollback_owners                      tasks.rollback.tables
    dead_letters                                           tasks.deadletters.tables

The same models run on SQLite, PostgreSQL and MariaDB; Alembic migrations in
`tasks/store/migrations` create them (`python -m tasks migrate`). A user's own tables (the
example job's, examples/tables.py) live on their own MetaData.
"""

from __future__ import annotations

from sqlalchemy.orm import DeclarativeBase

__all__ = ["Base"]


class Base(DeclarativeBase):
    pass
