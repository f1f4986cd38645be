"""The example's own table, on its own MetaData (not the platform's), and its create step.

    cm_data    id, status (0: still to do), payload, processed_count, processed_fence

`migrate(engine)` creates the table when it is missing and leaves an existing one alone, so it
is safe to run on every deploy, and a database migrated before the table left the platform
(migration 0001 used to create it) keeps its rows. `python -m examples.seed` runs it.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Engine, Integer, MetaData, String, Table

__all__ = ["METADATA", "CM_DATA", "migrate"]

METADATA = MetaData()

CM_DATA = Table(
    "cm_data",
    METADATA,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("status", Integer, nullable=False, default=0),
    Column("payload", String(255), nullable=False, default=""),
    Column("processed_count", Integer, nullable=False, default=0),
    Column("processed_fence", BigInteger, nullable=False, default=0),
)


def migrate(engine: Engine) -> None:
    """Create the example's tables on `engine` if they are missing (idempotent)."""
    METADATA.create_all(engine, checkfirst=True)
