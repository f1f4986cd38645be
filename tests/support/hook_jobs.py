"""Test-only range jobs with hooks (issue 21; EXTRA_TASK_MODULES names this module).

`cm_hooked` walks `cm_data` like the demo job; each of its hooks appends to the file
TEST_HOOK_LOG one line per try (`try RUN STATE PID`) and one when it completes (`done RUN
STATE PID`). While the file TEST_HOOK_STALL exists a first try stalls (its worker is to be
killed there); the try numbered TEST_HOOK_RAISE_AT (1-based, over the run's tries) raises.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.cm_data import mark_processed
from examples.tables import CM_DATA
from tasks.ranges.jobs import RangeJob, register

__all__ = ["cm_hooked", "log_lines", "note"]


def log_lines(path: Path) -> list[list[str]]:
    """The hook log's lines, split into words."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def note(path: Path, *words: object) -> None:
    with path.open("a") as out:  # one short write per line: appends do not interleave
        out.write(" ".join(str(w) for w in words) + "\n")


def _hook(run: dict[str, Any]) -> None:
    log = Path(os.environ["TEST_HOOK_LOG"])
    tries = 1 + sum(1 for w in log_lines(log) if w[:3] == ["try", str(run["run"]), run["state"]])
    note(log, "try", run["run"], run["state"], os.getpid())
    stall = os.environ.get("TEST_HOOK_STALL")
    while stall and Path(stall).exists() and tries == 1:
        time.sleep(0.1)
    if str(tries) == os.environ.get("TEST_HOOK_RAISE_AT"):
        raise RuntimeError(f"hook try {tries} fails on purpose")
    note(log, "done", run["run"], run["state"], os.getpid())


cm_hooked = register(RangeJob(
    name="cm_hooked", table=CM_DATA, where=CM_DATA.c.status == 0, process=mark_processed,
    columns=("id",), partition_size=500, batch_size=100,
    on_success=_hook, on_failure=_hook, on_cancel=_hook,
))
