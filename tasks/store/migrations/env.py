"""Alembic environment: migrations run on the connection `tasks.store.migrate.upgrade` hands
over, against the MetaData it hands over (the enabled wings' tables on it:
`tasks.wings.load_tables`; the shared `Base.metadata` as it stands when none is given), and
create only the tables it names (`tasks.store.migrations.gate`)."""

from alembic import context

from tasks.store.migrations.gate import WANTED
from tasks.store.models import Base

connection = context.config.attributes["connection"]
metadata = context.config.attributes.get("target_metadata") or Base.metadata
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True,
                  wanted_tables=context.config.attributes.get(WANTED))  # gate.WANTED
with context.begin_transaction():
    context.run_migrations()
