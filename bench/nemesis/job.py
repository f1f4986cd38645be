"""The nemesis run's own range job and saga, registered on its workers the way a user registers
theirs: `EXTRA_TASK_MODULES=bench.nemesis.job` (README, "Declaring a range job").

`nemesis_rows` walks the table `nemesis_rows`: its process function adds one to each row's
`times` and sets `done = 1` (so the filter `done = 0` stops matching) in the batch's
transaction; a row processed twice shows `times = 2`. Its knobs come from the environment the
harness gives the workers: NEMESIS_PARTITION_SIZE, NEMESIS_BATCH_SIZE, NEMESIS_BATCH_DELAY,
NEMESIS_ROWS_PER_S (the cap each run starts with; 0 for none).

`bench.nemesis.saga` is the example order saga (tasks.examples.saga) with a pause after each
step, so a revoke or a kill lands while it runs: reserve_stock, charge, ship, each journaled
before its effect; `fail_at` names a step that fails.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    Row,
    SmallInteger,
    Table,
    bindparam,
    func,
    update,
)

from tasks.celery import app
from tasks.examples.saga import STEPS, check_order, ledger, run_steps
from tasks.ranges.jobs import Context, RangeJob, register
from tasks.store.validate import InvalidArguments
from tasks.worker.base import PlatformTask

__all__ = ["ROWS", "JOB", "SAGA", "ddl", "nemesis_rows", "nemesis_saga"]

JOB = "nemesis_rows"
SAGA = "bench.nemesis.saga"

# Not on the platform's metadata: the harness creates this table (DDL) and no migration knows it.
ROWS = Table(
    "nemesis_rows", MetaData(),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("done", SmallInteger, nullable=False, server_default="0"),
    Column("times", Integer, nullable=False, server_default="0"),
    Column("created_at", DateTime(timezone=True), server_default=func.clock_timestamp()),
)



def ddl(sequence_start: int) -> tuple[str, ...]:
    """PostgreSQL: the table, and the cached sequence two pooled connections draw ids from
    (each session takes 20 ids at a time, so their rows commit out of id order by up to 20)."""
    return (
        "DROP TABLE IF EXISTS nemesis_rows",
        "DROP SEQUENCE IF EXISTS nemesis_seq",
        "CREATE TABLE nemesis_rows (id BIGINT PRIMARY KEY, done SMALLINT NOT NULL DEFAULT 0, "
        "times INTEGER NOT NULL DEFAULT 0, "
        "created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
        f"CREATE SEQUENCE nemesis_seq START {int(sequence_start)} CACHE 20",
    )


def _knob(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


# No `done = 0` guard: a second holder's write of the same row must show (times = 2), not be
# filtered away by PostgreSQL's re-check of the WHERE after the first holder commits.
_MARK = (update(ROWS).where(ROWS.c.id.in_(bindparam("ids", expanding=True)))
         .values(done=1, times=ROWS.c.times + 1))
BATCH_DELAY = _knob("NEMESIS_BATCH_DELAY", 0.0)


def mark_done(rows: Sequence[Row[Any]], ctx: Context) -> None:
    """The batch's effect: `times + 1` and `done = 1` for its rows, in its transaction."""
    if BATCH_DELAY > 0:
        time.sleep(BATCH_DELAY)
    ctx.session.execute(_MARK, {"ids": [row.id for row in rows]})


_RATE = _knob("NEMESIS_ROWS_PER_S", 0.0)

nemesis_rows = register(RangeJob(
    name=JOB, table=ROWS, where=ROWS.c.done == 0, process=mark_done, columns=("id",),
    partition_size=int(_knob("NEMESIS_PARTITION_SIZE", 2000)),
    batch_size=int(_knob("NEMESIS_BATCH_SIZE", 50)),
    rows_per_s=_RATE or None,
))


@app.task(name=SAGA, base=PlatformTask, soft_time_limit=30, time_limit=40)
def nemesis_saga(order_id: str, fail_at: str | None, pause_s: float) -> list[str]:
    """Reserve stock, charge, ship, pausing `pause_s` after each step; `fail_at` fails one."""
    order_id, fail_at = check_order(order_id, fail_at)
    if isinstance(pause_s, bool) or not isinstance(pause_s, int | float) or not 0 <= pause_s <= 5:
        raise InvalidArguments("pause_s must be a number in 0..5")
    for one in STEPS:
        run_steps(order_id, fail_at, (one,))
        time.sleep(pause_s)
    return ledger(order_id)
