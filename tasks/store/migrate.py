"""Apply the schema migrations: `python -m tasks migrate` (one command, idempotent)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, MetaData

__all__ = ["upgrade", "Applied"]

# One applied revision: its id and the first line of its docstring.
Applied = tuple[str, str]


def upgrade(engine: Engine, revision: str = "head", metadata: MetaData | None = None,
            schema: str | None = None) -> list[Applied]:
    """Bring the database behind `engine` to `revision`; return the revisions applied, oldest
    first (none: it was up to date). `metadata`: the tables the migrations are compared with
    (every wing's: `tasks.wings.load_tables()`); the revisions themselves create each table with
    Alembic operations, so they need no model. `schema` (PostgreSQL, DATABASE_SCHEMA): created
    first if missing; the engine puts it first on the search path."""
    config = Config()
    config.set_main_option("script_location", "tasks.store:migrations")
    with engine.begin() as connection:
        if schema is not None:
            # A validated identifier (envparse.identifier), never a task argument.
            connection.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        before = _heads(connection)
        config.attributes["connection"] = connection
        config.attributes["target_metadata"] = metadata
        command.upgrade(config, revision)
        after = _heads(connection)
    return _between(ScriptDirectory.from_config(config), before, after)


def _heads(connection: Connection) -> tuple[str, ...]:
    return tuple(MigrationContext.configure(connection).get_current_heads())


def _between(scripts: ScriptDirectory, before: tuple[str, ...],
             after: tuple[str, ...]) -> list[Applied]:
    if before == after:
        return []
    found = scripts.iterate_revisions(after, before or "base")
    return [(rev.revision, _summary(rev.doc or "")) for rev in reversed(list(found))]


def _summary(doc: str, width: int = 100) -> str:
    """The first sentence of a revision's docstring, on one line, at most `width` characters."""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    sentence = first.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= width else sentence[:width - 3] + "..."
