"""Apply the schema migrations: `python -m tasks migrate` (one command, idempotent)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, MetaData

__all__ = ["upgrade"]


def upgrade(engine: Engine, revision: str = "head", metadata: MetaData | None = None) -> None:
    """Bring the database behind `engine` to `revision`. `metadata`: the tables the migrations
    are compared with (every wing's: `tasks.wings.load_tables()`); the revisions themselves
    create each table with Alembic operations, so they need no model."""
    config = Config()
    config.set_main_option("script_location", "tasks.store:migrations")
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        config.attributes["target_metadata"] = metadata
        command.upgrade(config, revision)
