"""Test-only range jobs for the control tests (EXTRA_TASK_MODULES names this module).

Both walk `cm_data` like the demo job, in partitions of 5000 and batches of 200:
`cm_throttled` declares a cap of TEST_THROTTLED_RATE rows per second (default 2000);
`cm_gated` declares `throttle_on`, which says "wait" while the file TEST_GATE_FILE exists;
`cm_flaky` fails a batch holding a row whose payload is "boom" while TEST_FLAKY_FILE exists.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Row

from bench.cm_data import mark_processed
from examples.tables import CM_DATA
from tasks.ranges.jobs import Context, RangeJob, register

__all__ = ["cm_throttled", "cm_gated", "cm_flaky", "gate_closed", "BOOM"]

BOOM = "boom"


def gate_closed(_job: RangeJob) -> str | None:
    """`throttle_on` of cm_gated: "wait" while the gate file exists."""
    path = os.environ.get("TEST_GATE_FILE")
    return "wait" if path and Path(path).exists() else None


cm_throttled = register(RangeJob(
    name="cm_throttled", table=CM_DATA, where=CM_DATA.c.status == 0, process=mark_processed,
    columns=("id", "payload"), partition_size=5000, batch_size=200,
    rows_per_s=float(os.environ.get("TEST_THROTTLED_RATE", "2000")),
))

cm_gated = register(RangeJob(
    name="cm_gated", table=CM_DATA, where=CM_DATA.c.status == 0, process=mark_processed,
    columns=("id", "payload"), partition_size=5000, batch_size=200, throttle_on=gate_closed,
))


def _fail_on_boom(rows: Sequence[Row[Any]], ctx: Context) -> None:
    path = os.environ.get("TEST_FLAKY_FILE")
    if path and Path(path).exists() and any(row.payload == BOOM for row in rows):
        raise ValueError("boom")
    mark_processed(rows, ctx)


cm_flaky = register(RangeJob(
    name="cm_flaky", table=CM_DATA, where=CM_DATA.c.status == 0, process=_fail_on_boom,
    columns=("id", "payload"), partition_size=2000, batch_size=200,
))
