"""Which tables a migration run creates and alters: the enabled wings' (WINGS, `tasks.wings`).

A revision that creates or alters one wing's tables names them in its module's `TABLES` and
starts with `if not wanted(TABLES): return`. `tasks.store.migrate.upgrade` hands the run the
names of the enabled wings' tables (the MigrationContext option `WANTED`): a wing's revisions
do nothing while the wing is off and its tables are missing, and the first `migrate` after it
is turned on replays them in order (`tasks.store.migrate`). A wing turned off after its
tables were made keeps them, and its revisions keep them current.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from alembic import op

__all__ = ["WANTED", "wanted"]

# The MigrationContext option naming the tables to create: a frozenset of names, or None (no
# list handed over: every table, as before wings could be turned off).
WANTED = "wanted_tables"


def wanted(tables: Iterable[str]) -> bool:
    """True when the running revision should touch `tables`: they are an enabled wing's, or
    they exist already (a wing turned off later keeps its tables up to date)."""
    context = op.get_context()
    chosen = context.opts.get(WANTED)
    names = set(tables)
    if chosen is None or names <= chosen:
        return True
    inspector = sa.inspect(context.connection)
    return all(inspector.has_table(name) for name in names)
