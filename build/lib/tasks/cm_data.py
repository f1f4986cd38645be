"""The demo range job `cm_data` (seed 000): mark every row with `status = 0` processed.

Each processed row gets `status = 1`, `processed_count + 1` and the fence of the lease holder
that processed it, so a check afterwards can prove every row was processed exactly once.
CM_DATA_WORK=cpu adds real CPU work per row (for benchmarks); CM_DATA_PARTITION_SIZE and
CM_DATA_BATCH_SIZE override the seed's sizes (the demo uses smaller partitions);
CM_DATA_BATCH_DELAY (seconds) slows each batch down, so chaos tests can act mid-partition.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, update

from tasks.jobs import Context, RangeJob, register
from tasks.models import CM_DATA, CmData

__all__ = ["cm_data", "mark_processed", "cpu_work"]

CPU_ROUNDS = 2000


def cpu_work(row: Any) -> bytes:
    """A few milliseconds of hashing that releases the GIL (so threads run in parallel)."""
    return hashlib.pbkdf2_hmac("sha256", str(row.payload).encode(), b"cm_data", CPU_ROUNDS)


def mark_processed(rows: Sequence[Row[Any]], ctx: Context) -> None:
    """The batch's effect: one UPDATE inside the checkpoint's transaction."""
    if os.environ.get("CM_DATA_WORK", "trivial") == "cpu":
        ctx.map(cpu_work, rows)
    delay = float(os.environ.get("CM_DATA_BATCH_DELAY", "0"))
    if delay > 0:
        time.sleep(delay)
    table = CM_DATA
    ctx.session.execute(
        update(table)
        .where(table.c.id.in_([row.id for row in rows]))
        .values(status=1, processed_count=table.c.processed_count + 1, processed_fence=ctx.fence)
    )


cm_data = register(
    RangeJob(
        name="cm_data",
        table=CM_DATA,
        where=CmData.status == 0,
        process=mark_processed,
        columns=("id", "payload"),
        partition_size=int(os.environ.get("CM_DATA_PARTITION_SIZE", "2000000")),
        batch_size=int(os.environ.get("CM_DATA_BATCH_SIZE", "1000")),
        parallelism=int(os.environ.get("CM_DATA_PARALLELISM", "2")),
    )
)
