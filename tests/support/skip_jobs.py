"""A test-only range job with a skip policy, for the run-history tests (EXTRA_TASK_MODULES
names this module): `cm_skippy` walks `cm_data` in partitions of 1000 and batches of 100 and
raises `BadRow` for each row whose id is listed (comma-separated) in the file TEST_BAD_ROWS;
rewriting the file fixes or breaks rows while workers run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Row

from bench.cm_data import mark_processed
from examples.tables import CM_DATA
from tasks.ranges.jobs import Context, RangeJob, register

__all__ = ["BadRow", "cm_skippy", "bad_rows"]


class BadRow(ValueError):
    """A row the test job cannot process (yet)."""


def bad_rows() -> set[int]:
    path = os.environ.get("TEST_BAD_ROWS")
    if not path or not Path(path).exists():
        return set()
    return {int(i) for i in Path(path).read_text().split(",") if i.strip()}


def _picky(rows: Sequence[Row[Any]], ctx: Context) -> None:
    bad = sorted(r.id for r in rows if r.id in bad_rows())
    if bad:
        raise BadRow(f"row {bad[0]} has a bad payload")
    mark_processed(rows, ctx)


cm_skippy = register(RangeJob(
    name="cm_skippy", table=CM_DATA, where=CM_DATA.c.status == 0, process=_picky,
    columns=("id", "payload"), partition_size=1000, batch_size=100, skip_on=(BadRow,),
    skip_limit=10,
))
