"""The one MetaData (`Base.metadata`) every table of the platform is declared on.

Each table lives with its owner and registers itself here when its module is imported:

    work_items, schedules, range_runs, range_run_events    tasks.ranges.tables
    skus, orders, order_items, payments, restock_nodes      tasks.restock.tables
    rollback_journal, rollback_owners                      tasks.rollback.tables
    dead_letters                                           tasks.deadletters.tables
    cm_data                                                here (the example job's table)

The same models run on SQLite, PostgreSQL and MariaDB; Alembic migrations in
`tasks/store/migrations` create them (`python -m tasks migrate`).
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import BigInteger, Integer, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "CmData", "CM_DATA"]


class Base(DeclarativeBase):
    pass


class CmData(Base):
    """The demo table of seed 000: rows with `status = 0` are still to do."""

    __tablename__ = "cm_data"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    status: Mapped[int] = mapped_column(Integer, default=0, index=False)
    payload: Mapped[str] = mapped_column(String(255), default="")
    processed_count: Mapped[int] = mapped_column(Integer, default=0)
    processed_fence: Mapped[int] = mapped_column(BigInteger, default=0)


CM_DATA = cast(Table, CmData.__table__)
