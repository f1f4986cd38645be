"""Test-only range jobs (registered when EXTRA_TASK_MODULES names them, as the tests do).

`poison_pill` walks `cm_data` like the demo job, but its process function SIGKILLs its own
pool process when a batch holds a row whose payload is "poison" (an OOM kill, a segfault in a
C extension): the partition never gets past that row, so only the redelivery cap ends it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row

from bench.cm_data import mark_processed
from examples.tables import CM_DATA
from tasks.ranges.jobs import Context, RangeJob, register

__all__ = ["poison_pill", "POISON"]

POISON = "poison"


def _die_on_poison(rows: Sequence[Row[Any]], ctx: Context) -> None:
    if any(row.payload == POISON for row in rows):
        os.kill(os.getpid(), signal.SIGKILL)
    mark_processed(rows, ctx)


poison_pill = register(
    RangeJob(
        name="poison_pill",
        table=CM_DATA,
        where=CM_DATA.c.status == 0,
        process=_die_on_poison,
        columns=("id", "payload"),
        partition_size=100,
        batch_size=20,
        parallelism=1,
    )
)
