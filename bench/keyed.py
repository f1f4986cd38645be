"""Range jobs over other keys than an integer id, on one table (`python -m bench range --key
uuid|composite`, and the tests of tasks/ranges/jobkeys.py on real workers, which register
this module through EXTRA_TASK_MODULES):

    keyed_rows   id (integer primary key), uid (a UUID, unique), created_at (a timestamp;
                 about three rows share each one), status (0: still to do), payload,
                 processed_count, processed_fence; an index on (created_at, id)

    keyed_int        walks it by `id` (the integer path, id-span partitions)
    keyed_uuid       by `uid` (id_column="uid"), partitions cut by rows
    keyed_composite  by (created_at, id), a tuple keyset

Each processed row gets `status = 1`, `processed_count + 1` and the holder's fence, written by
the batch's list of ids, the same effect for all three, so their rates compare the reads.

Knobs (read when a worker imports this module): KEYED_PARTITION_SIZE (rows or ids per
partition, 5000), KEYED_BATCH_SIZE (rows per batch, 200), KEYED_BATCH_DELAY (seconds each
batch sleeps, 0).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Index,
    Integer,
    MetaData,
    Row,
    String,
    Table,
    Uuid,
    bindparam,
    insert,
    update,
)

from tasks.config import envparse
from tasks.ranges.jobs import Context, RangeJob, register

__all__ = ["KEYED", "METADATA", "JOBS", "create", "seed", "mark", "job_for"]

METADATA = MetaData()
KEYED = Table(
    "keyed_rows",
    METADATA,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=False),
    Column("uid", Uuid, nullable=False, unique=True),
    Column("created_at", DateTime, nullable=False),
    Column("status", Integer, nullable=False, default=0),
    Column("payload", String(64), nullable=False, default=""),
    Column("processed_count", Integer, nullable=False, default=0),
    Column("processed_fence", BigInteger, nullable=False, default=0),
    Index("ix_keyed_rows_created_id", "created_at", "id"),
)
BASE = datetime(2026, 1, 1)
CHUNK = 5000  # rows per INSERT: under every driver's bind limit
IDS_CHUNK = 10_000


def _knob(name: str, default: str, parse: Any) -> Any:
    return parse(name, os.environ.get(name, "").strip() or default)


PARTITION_SIZE = _knob("KEYED_PARTITION_SIZE", "5000", envparse.at_least(int, 1))
BATCH_SIZE = _knob("KEYED_BATCH_SIZE", "200", envparse.at_least(int, 1))
BATCH_DELAY = _knob("KEYED_BATCH_DELAY", "0", envparse.at_least(float, 0))


def create(engine: Engine) -> None:
    """Drop and create the table (it is the benchmark's and the tests' own)."""
    METADATA.drop_all(engine, checkfirst=True)
    METADATA.create_all(engine)


def seed(engine: Engine, rows: int, seed_value: int = 7, first_id: int = 1,
         stride: int = 1) -> None:
    """Insert `rows` rows to do: ids from `first_id`, random UUIDs, and timestamps in a
    shuffled order with about three rows on each (so the composite key's second column
    matters), `stride` seconds apart."""
    rnd = random.Random(seed_value)
    stamps = [BASE + timedelta(seconds=stride * (i // 3)) for i in range(rows)]
    rnd.shuffle(stamps)
    with engine.begin() as conn:
        for lo in range(0, rows, CHUNK):
            conn.execute(insert(KEYED), [
                {"id": first_id + i, "uid": uuid.UUID(int=rnd.getrandbits(128), version=4),
                 "created_at": stamps[i], "status": 0, "payload": f"row-{first_id + i}",
                 "processed_count": 0, "processed_fence": 0}
                for i in range(lo, min(lo + CHUNK, rows))])


_MARK = update(KEYED).values(status=1, processed_count=KEYED.c.processed_count + 1,
                             processed_fence=bindparam("fence"))


def mark(rows: Sequence[Row[Any]], ctx: Context) -> None:
    """The batch's effect, by its list of ids, inside the checkpoint's transaction."""
    if BATCH_DELAY > 0:
        time.sleep(BATCH_DELAY)
    ids = [row.id for row in rows]
    for at in range(0, len(ids), IDS_CHUNK):
        ctx.session.execute(_MARK.where(ctx.in_batch(KEYED.c.id, ids[at:at + IDS_CHUNK])),
                            {"fence": ctx.fence})


def job_for(name: str, key: tuple[str, ...], **options: Any) -> RangeJob:
    """A job over keyed_rows walking `key` (not registered)."""
    columns = tuple(dict.fromkeys((*key, "id")))
    values: dict[str, Any] = {"partition_size": PARTITION_SIZE, "batch_size": BATCH_SIZE,
                              **options}
    return RangeJob(name=name, table=KEYED, where=KEYED.c.status == 0, process=mark,
                    columns=columns, key=key, **values)


JOBS = {
    "int": register(job_for("keyed_int", ("id",))),
    "uuid": register(job_for("keyed_uuid", ("uid",))),
    "composite": register(job_for("keyed_composite", ("created_at", "id"))),
}
