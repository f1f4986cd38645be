"""The example range job: mark every row of cm_data with status 0 processed, exactly once."""

import os
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import update

from examples.tables import CM_DATA as t
from tasks.ranges.jobs import Context, RangeJob, register


def knob(name: str, default: float) -> float:
    """This job's own setting `name`, read once: when a worker imports this module."""
    raw = os.environ.get(name) or str(default)
    if not raw.replace(".", "", 1).isdigit():
        raise ValueError(f"{name}={raw!r} is not a number >= 0")
    return float(raw)


BATCH_DELAY = knob("CM_DATA_BATCH_DELAY", 0)  # seconds each batch sleeps (the demo's slow motion)


def mark_processed(rows: Sequence[Any], ctx: Context) -> None:
    """The batch's effect, inside its transaction: the rows stop matching `where`."""
    time.sleep(BATCH_DELAY)
    ctx.session.execute(update(t).where(ctx.in_batch(t.c.id, (r.id for r in rows))).values(
        status=1, processed_count=t.c.processed_count + 1, processed_fence=ctx.fence))


cm_data = register(RangeJob(
    name="cm_data", table=t, where=t.c.status == 0, process=mark_processed,
    partition_size=int(knob("CM_DATA_PARTITION_SIZE", 2_000_000)),
    batch_size=int(knob("CM_DATA_BATCH_SIZE", 1000))))
