"""Apply the schema migrations: `python -m tasks migrate` (one command, idempotent)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

__all__ = ["upgrade"]


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database behind `engine` to `revision`."""
    config = Config()
    config.set_main_option("script_location", "tasks.store:migrations")
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
