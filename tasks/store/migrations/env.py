"""Alembic environment: migrations run on the connection `tasks.store.migrate.upgrade` hands
over, against the MetaData it hands over (every wing's tables on it: `tasks.wings.load_tables`;
the shared `Base.metadata` as it stands when none is given)."""

from alembic import context

from tasks.store.models import Base

connection = context.config.attributes["connection"]
metadata = context.config.attributes.get("target_metadata") or Base.metadata
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
