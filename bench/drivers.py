"""The hand-written baselines of `python -m bench range`: the scan a user would write on the
bare database driver (sqlite3, psycopg or PyMySQL), no SQLAlchemy, no leases, no Celery.

Two of them, per batch a keyset read and then one UPDATE:

- by id range (`driver_scan`): `WHERE id BETWEEN first AND last AND status = 0`, exact only
  because one process walks the table and nothing else writes;
- by id list (`driver_list_scan`): `WHERE id = ANY(%s)` with one array parameter on
  PostgreSQL, `WHERE id IN (...)` elsewhere: what a script safe under concurrent inserts
  writes, and what the platform's job writes on a server database.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import make_url

from bench.cm_data import cpu_work

__all__ = ["driver_scan", "driver_list_scan"]

# The driver script's statements; `%s` placeholders (psycopg, PyMySQL), `?` for sqlite3.
DRIVER_READ = ("SELECT id, payload FROM cm_data WHERE id >= %s AND status = 0 "
               "ORDER BY id LIMIT %s")
DRIVER_SET = "UPDATE cm_data SET status = 1, processed_count = processed_count + 1"
DRIVER_WRITE = f"{DRIVER_SET} WHERE id BETWEEN %s AND %s AND status = 0"


def driver_scan(url: str, batch: int, work: str) -> float:
    """Per batch, a keyset read, then one UPDATE by the id range the read covered."""
    return _scan(url, batch, work, _by_range)


def driver_list_scan(url: str, batch: int, work: str) -> float:
    """Per batch, a keyset read, then one UPDATE by the list of ids read."""
    return _scan(url, batch, work, _by_list)


# How a batch's rows are written: (cursor, placeholder style, dialect, rows).
Write = Callable[[Any, str, str, list[Any]], None]


def _by_range(cursor: Any, style: str, _backend: str, rows: list[Any]) -> None:
    cursor.execute(DRIVER_WRITE.replace("%s", style), (rows[0][0], rows[-1][0]))


def _by_list(cursor: Any, style: str, backend: str, rows: list[Any]) -> None:
    ids = [row[0] for row in rows]
    if backend == "postgresql":
        cursor.execute(f"{DRIVER_SET} WHERE id = ANY(%s)", (ids,))
        return
    cursor.execute(f"{DRIVER_SET} WHERE id IN ({', '.join([style] * len(ids))})", ids)


def _scan(url: str, batch: int, work: str, write: Write) -> float:
    conn, style = _driver_connect(url)
    backend = make_url(url).get_backend_name()
    read = DRIVER_READ.replace("%s", style)
    started = time.perf_counter()
    done, next_id = 0, 0
    try:
        cursor = conn.cursor()
        while True:
            cursor.execute(read, (next_id, batch))
            rows = cursor.fetchall()
            if not rows:
                conn.rollback()
                break
            if work == "cpu":
                for row in rows:
                    cpu_work(_Row(row[1]))
            write(cursor, style, backend, rows)
            conn.commit()
            done += len(rows)
            next_id = rows[-1][0] + 1
    finally:
        conn.close()
    return done / (time.perf_counter() - started)


class _Row:
    """What `cpu_work` reads of a row."""

    def __init__(self, payload: str) -> None:
        self.payload = payload


def _driver_connect(url: str) -> tuple[Any, str]:
    """A plain DB-API connection to `url` (parsed only) and its placeholder style."""
    parts = make_url(url)
    backend = parts.get_backend_name()
    if backend == "sqlite":
        conn = sqlite3.connect(parts.database or "", timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")  # the platform's settings (tasks.store.resources)
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn, "?"
    if backend == "postgresql":
        import psycopg

        return psycopg.connect(parts.set(drivername="postgresql")
                               .render_as_string(hide_password=False)), "%s"
    import pymysql

    return pymysql.connect(host=parts.host, port=parts.port or 3306, user=parts.username,
                           password=parts.password or "", database=parts.database), "%s"
