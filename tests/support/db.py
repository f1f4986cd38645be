"""Real databases for tests: SQLite files, and the PostgreSQL and MariaDB of this machine."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine

from tasks.demo import reset_database
from tasks.migrate import upgrade
from tasks.resources import make_engine

DATABASES = {
    "postgresql": os.environ.get("TEST_POSTGRES_URL",
                                 "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}


def database_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/test.sqlite"
    return DATABASES[kind]


def fresh_database(url: str) -> Engine:
    """An engine on `url` with this project's tables dropped and migrated anew."""
    engine = make_engine(url)
    reset_database(engine)
    upgrade(engine)
    return engine
