"""Real databases for tests: SQLite files, and the PostgreSQL and MariaDB of this machine."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from devtools.demo import reset_database
from examples.tables import migrate
from tasks.store.migrate import upgrade
from tasks.store.resources import make_engine

DATABASES = {
    "postgresql": os.environ.get("TEST_POSTGRES_URL",
                                 "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}


def ensure_databases() -> None:
    """Create the PostgreSQL and MariaDB databases of `DATABASES` when they are missing (each
    xdist worker has its own)."""
    for url in DATABASES.values():
        parsed = make_url(url)
        name = parsed.database
        assert name and name.replace("_", "").isalnum(), name  # a name from env, quoted below
        # Connect through the server's own database, which always exists.
        system = "postgres" if parsed.get_backend_name() == "postgresql" else "mysql"
        server = create_engine(parsed.set(database=system), isolation_level="AUTOCOMMIT")
        try:
            with server.connect() as conn:
                if parsed.get_backend_name() == "postgresql":
                    found = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                         {"n": name}).first()
                    if found is None:
                        conn.execute(text(f'CREATE DATABASE "{name}"'))
                else:
                    conn.execute(text(f"CREATE DATABASE IF NOT EXISTS `{name}`"))
        finally:
            server.dispose()


def database_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/test.sqlite"
    return DATABASES[kind]


def fresh_database(url: str) -> Engine:
    """An engine on `url` with this project's tables dropped and migrated anew, the example's
    table cm_data (examples/tables.py) included."""
    engine = make_engine(url)
    reset_database(engine)
    upgrade(engine)
    migrate(engine)
    return engine
