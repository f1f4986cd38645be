"""Apply the schema migrations: `python -m tasks migrate` (one command, idempotent).

Only the tables of the metadata handed over are created (the enabled wings', WINGS): a wing's
revisions do nothing while it is off (`tasks.store.migrations.gate`), and the first upgrade
after it is turned on replays them, in order, on the same transaction.
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from sqlalchemy import Connection, Engine, MetaData, inspect

from tasks.store.migrations.gate import WANTED

__all__ = ["upgrade", "Applied"]

# One applied revision: its id and the first line of its docstring.
Applied = tuple[str, str]


def upgrade(engine: Engine, revision: str = "head", metadata: MetaData | None = None,
            schema: str | None = None) -> list[Applied]:
    """Bring the database behind `engine` to `revision`; return the revisions applied, oldest
    first (none: it was up to date). `metadata`: the tables the migrations are compared with
    (the enabled wings': `tasks.wings.load_tables()`), and the only wing tables created (none
    given: every table); the revisions themselves create each table with Alembic operations,
    so they need no model. `schema` (PostgreSQL, DATABASE_SCHEMA): created first if missing;
    the engine puts it first on the search path."""
    config = Config()
    config.set_main_option("script_location", "tasks.store:migrations")
    wanted = None if metadata is None else frozenset(metadata.tables)
    scripts = ScriptDirectory.from_config(config)
    with engine.begin() as connection:
        if schema is not None:
            # A validated identifier (envparse.identifier), never a task argument.
            connection.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        before = _heads(connection)
        config.attributes["connection"] = connection
        config.attributes["target_metadata"] = metadata
        config.attributes[WANTED] = wanted
        command.upgrade(config, revision)
        after = _heads(connection)
        applied = _between(scripts, before, after)
        skipped = _skipped(connection, scripts, [rev for rev, _ in applied])
        replayed = _replay(connection, scripts, wanted) if revision == "head" else []
    return [(rev, doc + (" (skipped: its wing is off)" if rev in skipped else ""))
            for rev, doc in applied] + replayed


def _skipped(connection: Connection, scripts: ScriptDirectory, applied: list[str]) -> set[str]:
    """The `applied` revisions of a wing's tables that did nothing (the tables are missing)."""
    inspector = inspect(connection)
    return {rev for rev in applied if (names := _tables(scripts.get_revision(rev)))
            and not all(inspector.has_table(name) for name in names)}


def _replay(connection: Connection, scripts: ScriptDirectory,
            wanted: frozenset[str] | None) -> list[Applied]:
    """Run again, oldest first, the revisions of wing tables that are wanted but missing: a
    wing turned on after its revisions were applied while it was off."""
    if wanted is None:
        return []
    inspector = inspect(connection)
    missing = {name for name in wanted if not inspector.has_table(name)}
    found = [rev for rev in reversed(list(scripts.walk_revisions()))
             if missing & set(_tables(rev))]
    if not found:
        return []
    context = MigrationContext.configure(connection, opts={WANTED: wanted,
                                                           "render_as_batch": True})
    with Operations.context(context):
        for rev in found:
            rev.module.upgrade()
    return [(rev.revision, "again, for a wing turned on: " + _summary(rev.doc or ""))
            for rev in found]


def _tables(rev: Script) -> tuple[str, ...]:
    """The wing tables revision `rev` creates or alters (its `TABLES`), none for the core's."""
    return tuple(getattr(rev.module, "TABLES", ()))


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
