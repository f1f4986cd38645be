"""Test-only range jobs for the live schedule tests (tests/ranges/test_schedules_live.py;
EXTRA_TASK_MODULES names this module).

All visit `cm_data` once per run and change nothing (`visits="once"`), so every run of a job
walks the same rows for the same time and the jobs do not disturb each other. `sched_skip`,
`sched_replace` and `sched_queue` are capped at SCHEDULE_TEST_RATE rows/s (default 5) in
batches of 5: the test's 75 rows take about 15 s, longer than their 10 s schedule.
`sched_missed_skip` and `sched_missed_once` run at full speed (the missed-window test).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from examples.tables import CM_DATA
from tasks.ranges.jobs import Context, RangeJob, register

__all__ = ["SLOW", "QUICK"]


def _visit(rows: Sequence[Any], ctx: Context) -> None:
    """A visit that changes nothing: the run's length is its throttle's."""


RATE = float(os.environ.get("SCHEDULE_TEST_RATE", "5"))

SLOW = tuple(register(RangeJob(
    name=name, table=CM_DATA, visits="once", process=_visit, partition_size=100_000,
    batch_size=5, rows_per_s=RATE)) for name in ("sched_skip", "sched_replace", "sched_queue"))

QUICK = tuple(register(RangeJob(
    name=name, table=CM_DATA, visits="once", process=_visit, partition_size=100_000,
    batch_size=100)) for name in ("sched_missed_skip", "sched_missed_once"))
