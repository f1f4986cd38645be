"""The benchmarks' variant of the example job `cm_data` (examples/cm_data.py): the same job
name, table and effect, tuned and instrumented for measurement, registered the way a user's job
is, through EXTRA_TASK_MODULES (`bench.cm_data`: the benchmarks' workers and the tests' do so;
never a production worker).

Each processed row gets `status = 1`, `processed_count + 1` and the fence of the lease holder
that processed it, so a check afterwards can prove every row was processed exactly once.

Its knobs are its own environment variables (the example's names, plus the benchmarks' own),
read once when a worker imports it (a bad value stops the worker with a message naming the
variable):

| variable | default | meaning |
| --- | --- | --- |
| `CM_DATA_PARTITION_SIZE` | 2000000 | ids per partition (applies to partitions planned later) |
| `CM_DATA_BATCH_SIZE` | 1000 | rows per batch |
| `CM_DATA_PARALLELISM` | 2 | threads per batch for `ctx.map` |
| `CM_DATA_WORK` | trivial | `cpu` adds real CPU work per row (benchmarks) |
| `CM_DATA_BATCH_DELAY` | 0 | seconds each batch sleeps, so chaos tests can act mid-partition |
| `CM_DATA_TARGET_BATCH_S` | 0 | seconds per batch to hold, sizing batches adaptively (0: fixed) |

The effect is one UPDATE per batch. When the runner says the batch's rows are every row of
their id range still to do (`ctx.span`: SQLite, where the batch holds the write lock from its
read, and PostgreSQL, where it reads and writes in one snapshot; no quarantined row in the
range), the UPDATE goes by that id range, `id BETWEEN first AND last AND status = 0`, which
touches exactly the rows read; otherwise (MariaDB) by the list of ids (`ctx.in_batch`),
IDS_CHUNK ids a statement
(docs/decisions.md, "Adaptive batches, skips and the driver baseline").
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, bindparam, update

from examples.tables import CM_DATA
from tasks.config import envparse
from tasks.ranges.jobs import Context, RangeJob, register
from tasks.ranges.reads import ids_of

__all__ = ["cm_data", "mark_processed", "cpu_work", "CmDataConfig", "load_config", "CONFIG"]

CPU_ROUNDS = 2000
WORK_KINDS = ("trivial", "cpu")
# The bounds of an adaptive batch (CM_DATA_TARGET_BATCH_S): 50,000 rows take about 40 ms on
# SQLite, so the per-batch costs (a transaction, the guard, the gate's Redis call) stay small.
MIN_BATCH = 100
MAX_BATCH = 50_000
IDS_CHUNK = 10_000  # ids per UPDATE when written by ids: under every driver's bind limit
# Rows per read (and per UPDATE) inside a batch: measured on SQLite, reads and writes of 1,000
# to 2,000 rows cost about 12% less per row than reads of 5,000 or more (docs/decisions.md).
FETCH_SIZE = 2000

@dataclass(frozen=True)
class CmDataConfig:
    """The job's knobs (CM_DATA_*)."""

    partition_size: int = 2_000_000
    batch_size: int = 1000
    parallelism: int = 2
    work: str = "trivial"
    batch_delay: float = 0.0
    target_batch_s: float = 0.0


# Each knob: its variable and its parser (the platform's own, so a bad value reads the same).
_KNOBS: dict[str, tuple[str, Any]] = {
    "partition_size": ("CM_DATA_PARTITION_SIZE", envparse.at_least(int, 1)),
    "batch_size": ("CM_DATA_BATCH_SIZE", envparse.at_least(int, 1)),
    "parallelism": ("CM_DATA_PARALLELISM", envparse.at_least(int, 1)),
    "work": ("CM_DATA_WORK", envparse.one_of(*WORK_KINDS)),
    "batch_delay": ("CM_DATA_BATCH_DELAY", envparse.at_least(float, 0)),
    "target_batch_s": ("CM_DATA_TARGET_BATCH_S", envparse.at_least(float, 0)),
}


def load_config(env: Mapping[str, str] | None = None) -> CmDataConfig:
    """The CM_DATA_* knobs of `env` (default: `os.environ`); `SettingsError` naming the
    variable if one is bad."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for field, (name, parse) in _KNOBS.items():
        raw = env.get(name, "").strip()
        if raw:
            values[field] = parse(name, raw)
    return CmDataConfig(**values)


CONFIG = load_config()


def cpu_work(row: Any) -> bytes:
    """A few milliseconds of hashing that releases the GIL (so threads run in parallel)."""
    return hashlib.pbkdf2_hmac("sha256", str(row.payload).encode(), b"cm_data", CPU_ROUNDS)


# The effect, built once: by the batch's id range (`ctx.span`) or by its list of ids.
_MARK = update(CM_DATA).values(status=1, processed_count=CM_DATA.c.processed_count + 1,
                               processed_fence=bindparam("fence"))
MARK_SPAN = _MARK.where(CM_DATA.c.id.between(bindparam("first"), bindparam("last")),
                        CM_DATA.c.status == 0)


def mark_processed(rows: Sequence[Row[Any]], ctx: Context) -> None:
    """The batch's effect: one UPDATE inside the checkpoint's transaction."""
    if CONFIG.work == "cpu":
        ctx.map(cpu_work, rows)
    if CONFIG.batch_delay > 0:
        time.sleep(CONFIG.batch_delay)
    if ctx.span is not None:
        first, last = ctx.span
        ctx.session.execute(MARK_SPAN, {"first": first, "last": last, "fence": ctx.fence})
    else:
        ids = ids_of(rows, "id")  # off the driver's tuples: no Row made per row
        for at in range(0, len(ids), IDS_CHUNK):
            ctx.session.execute(_MARK.where(ctx.in_batch(CM_DATA.c.id, ids[at:at + IDS_CHUNK])),
                                {"fence": ctx.fence})


cm_data = register(
    RangeJob(
        name="cm_data",
        table=CM_DATA,
        where=CM_DATA.c.status == 0,
        process=mark_processed,
        columns=("id", "payload"),
        partition_size=CONFIG.partition_size,
        batch_size=CONFIG.batch_size,
        parallelism=CONFIG.parallelism,
        target_batch_s=CONFIG.target_batch_s or None,
        min_batch_size=MIN_BATCH,
        max_batch_size=MAX_BATCH,
        fetch_size=FETCH_SIZE,
    )
)
