"""`BENCH_SCALE_JOBS` range jobs over one `cm_data` table, for `python -m bench scale --jobs N`.

Job `scale_jK` (K = 0 .. N-1) owns the rows whose id is K modulo N, so the N jobs walk the
same table side by side and none touches another's rows. Its partitions are
`CM_DATA_PARTITION_SIZE` ids long (read by `bench.cm_data`); its effect marks its batch's
rows by their ids (never by id range: the range holds the other jobs' rows). Registered
through EXTRA_TASK_MODULES, like every user's job; with the variable unset or 0 it registers
nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, update

from bench.cm_data import CONFIG
from examples.tables import CM_DATA
from tasks.config import envparse
from tasks.ranges.jobs import Context, RangeJob, register

__all__ = ["JOBS", "job_names"]

JOBS = envparse.at_least(int, 0)("BENCH_SCALE_JOBS", os.environ.get("BENCH_SCALE_JOBS") or "0")


def job_names(count: int) -> list[str]:
    return [f"scale_j{k}" for k in range(count)]


def _mark(rows: Sequence[Row[Any]], ctx: Context) -> None:
    ids = [row.id for row in rows]
    ctx.session.execute(update(CM_DATA).where(ctx.in_batch(CM_DATA.c.id, ids)).values(
        status=1, processed_count=CM_DATA.c.processed_count + 1, processed_fence=ctx.fence))


for _k, _name in enumerate(job_names(JOBS)):
    register(RangeJob(name=_name, table=CM_DATA,
                      where=(CM_DATA.c.status == 0) & (CM_DATA.c.id % JOBS == _k),
                      process=_mark, columns=("id",), partition_size=CONFIG.partition_size,
                      batch_size=500))
