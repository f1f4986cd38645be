"""`python -m tasks status`, range jobs: a summary line per job and every partition.

A job's progress is read from its partitions (one query, no scan of the job's table):

- rows done: the rows its partitions processed (`rows_done`, committed with each batch);
- ids walked of ids planned: the planned id space (`hi - lo + 1` of every partition) is an
  upper bound of the rows the job can process; a finished partition counts whole, an open one
  up to its checkpoint;
- rows/s: the sum of the rates of its running partitions;
- ETA: the ids left, at the rate ids are being walked (rows/s times ids walked per row done so
  far). An estimate: it assumes the rest of the table matches the filter as densely as the
  part already walked. No ETA while nothing runs or nothing has been processed yet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from importlib import import_module
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.tables import WORK, PartitionStatus
from tasks.ranges.workrow import every_partition
from tasks.store.db import utcnow

__all__ = ["PartitionView", "JobSummary", "partitions", "summarize", "jobs_table",
           "partitions_table", "ranges_json", "format_eta"]

# Consoles narrower than this get the compact partition tables (the wide one needs ~130).
COMPACT_BELOW = 130

NO_PARTITIONS = ("no range job has partitions yet "
                 "(start one: celery -A tasks call tasks.ranges.start --args '[\"cm_data\"]')")


@dataclass(frozen=True)
class PartitionView:
    job: str
    part: int
    lo: int
    hi: int
    status: str
    owner: str | None
    checkpoint: int
    rows_done: int
    rows_per_s: float
    fence: int
    claims: int
    error: str | None
    heartbeat_at: datetime | None
    # Until when the holder waits for the job's throttle before its next batch (None: not).
    throttled_until: datetime | None = None

    @property
    def takeovers(self) -> int:
        """Claims beyond the first: each one is a handover or a failover."""
        return max(self.claims - 1, 0)

    @property
    def ids_walked(self) -> int:
        """Ids of lo..hi behind the partition (all of them once it is finished)."""
        size = self.hi - self.lo + 1
        if self.status in (PartitionStatus.DONE, PartitionStatus.EMPTY):
            return size
        return min(max(self.checkpoint - self.lo, 0), size)


@dataclass(frozen=True)
class JobSummary:
    """One range job's progress, read from its partitions."""

    job: str
    state: str
    rows_done: int
    ids_walked: int
    ids_planned: int
    rows_per_s: float
    eta_s: float | None
    partitions: dict[str, int]
    run: int | None = None  # the current run's id, when the job has a run history
    throttle_rows_per_s: float | None = None  # the run's rows/s cap (None: not throttled)


def partitions(sessions: sessionmaker[Session], job: str | None = None) -> list[PartitionView]:
    query = select(WORK).where(every_partition()).order_by(WORK.c.job, WORK.c.part)
    if job is not None:
        query = query.where(WORK.c.job == job)
    with sessions() as session:
        rows = session.execute(query).all()
    return [PartitionView(r.job, r.part, r.lo, r.hi, r.status, r.owner, r.next_id, r.rows_done,
                          r.rate, r.fence, r.claims, r.error, r.heartbeat_at,
                          getattr(r, "throttled_until", None)) for r in rows]


def summarize(views: Sequence[PartitionView],
              sessions: sessionmaker[Session] | None = None) -> list[JobSummary]:
    """A summary per job of `views` (the run's state and throttle from the run history when
    `sessions` is given and the job has a run)."""
    by_job: dict[str, list[PartitionView]] = {}
    for v in views:
        by_job.setdefault(v.job, []).append(v)
    current_run = _run_reader(sessions)
    summaries = []
    for job, parts in by_job.items():
        states = Counter(v.status for v in parts)
        rows = sum(v.rows_done for v in parts)
        walked = sum(v.ids_walked for v in parts)
        planned = sum(v.hi - v.lo + 1 for v in parts)
        rate = sum(v.rows_per_s for v in parts if v.status == PartitionStatus.RUNNING)
        eta = None
        if rate > 0 and rows > 0 and walked < planned:
            eta = (planned - walked) / (rate * walked / rows)
        run = current_run(job) if current_run is not None else None
        state = getattr(run, "state", None) or _derived_state(states)
        summaries.append(JobSummary(job, str(state), rows, walked, planned, rate, eta,
                                    dict(sorted(states.items())), getattr(run, "id", None),
                                    getattr(run, "rows_per_s", None)))
    return summaries


def _derived_state(states: Counter[str]) -> str:
    """A job's state when no run is recorded: from its partitions' states."""
    if states[PartitionStatus.RUNNING]:
        return "running"
    open_states = [s for s in states if s not in PartitionStatus.FINISHED]
    if open_states:
        return "pending" if set(open_states) == {PartitionStatus.PENDING} else open_states[0]
    return "failed" if states[PartitionStatus.FAILED] else "done"


def _run_reader(sessions: sessionmaker[Session] | None) -> Callable[[str], Any] | None:
    """`job -> current_run(sessions, job)` from the wing's run history (`tasks.ranges.runs`,
    looked up by name so this view also works on a schema without it), or None."""
    if sessions is None:
        return None
    try:
        current_run = getattr(import_module("tasks.ranges.runs"), "current_run", None)
    except ImportError:
        return None
    if current_run is None:
        return None
    return lambda job: current_run(sessions, job)


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes \
        else f"{secs}s"


def jobs_table(summaries: Sequence[JobSummary]) -> Table:
    table = Table(title="range jobs")
    for column in ("job", "run", "rows done", "ids walked", "rows/s", "ETA", "partitions"):
        table.add_column(column, overflow="fold", justify="left" if column in (
            "job", "run", "partitions") else "right")
    for s in summaries:
        share = s.ids_walked / s.ids_planned if s.ids_planned else 1.0
        cap = f" (cap {s.throttle_rows_per_s:,.0f})" if s.throttle_rows_per_s else ""
        table.add_row(s.job, s.state if s.run is None else f"{s.state} (run {s.run})",
                      f"{s.rows_done:,}", f"{s.ids_walked:,} of {s.ids_planned:,} ({share:.1%})",
                      f"{s.rows_per_s:,.0f}{cap}", format_eta(s.eta_s),
                      ", ".join(f"{n} {state}" for state, n in s.partitions.items()))
    return table


def partitions_table(views: Sequence[PartitionView], width: int = 10_000,
                     job: str | None = None) -> RenderableType:
    """Every partition (of `job`, when given); on a console narrower than COMPACT_BELOW, one
    table per job with two-line cells (ids over checkpoint, rows over rate, fence over
    takeovers)."""
    if not views:
        return Text(NO_PARTITIONS if job is None else
                    f"range job {job!r} has no partitions (never started, or no such job)")
    if width < COMPACT_BELOW:
        return Group(*(_compact_table(job, [v for v in views if v.job == job])
                       for job in dict.fromkeys(v.job for v in views)))
    table = Table(title="range partitions")
    for column in ("job", "part", "ids", "state", "owner", "checkpoint", "rows done", "rows/s",
                   "fence", "takeovers"):
        table.add_column(column, overflow="fold", justify="right" if column not in (
            "job", "state", "owner") else "left")
    for v in views:
        table.add_row(v.job, str(v.part), f"{v.lo}..{v.hi}", _state(v), v.owner or "-",
                      str(v.checkpoint), str(v.rows_done), f"{v.rows_per_s:,.0f}", str(v.fence),
                      str(v.takeovers))
    return table


def _compact_table(job: str, views: Sequence[PartitionView]) -> Table:
    table = Table(title=f"partitions of {job}", box=box.SIMPLE_HEAD)
    for column in ("part", "ids\ncheckpoint", "state", "owner", "rows done\nrows/s",
                   "fence\ntakeovers"):
        text = column in ("state", "owner")
        # Numbers keep their lines whole; the state (an error) and the owner fold.
        table.add_column(column, overflow="fold", no_wrap=not text,
                         justify="left" if text else "right")
    for v in views:
        table.add_row(str(v.part), f"{v.lo}..{v.hi}\n{v.checkpoint}", _state(v), v.owner or "-",
                      f"{v.rows_done:,}\n{v.rows_per_s:,.0f}/s", f"{v.fence}\n{v.takeovers}")
    return table


def _state(v: PartitionView) -> str:
    if v.status == PartitionStatus.FAILED:
        return f"failed: {v.error}"
    if v.status == PartitionStatus.RUNNING and v.throttled_until is not None:
        wait = (v.throttled_until - utcnow()).total_seconds()
        if wait > 0:
            return f"running, throttled {wait:,.1f}s"
    return v.status


def ranges_json(views: Sequence[PartitionView], summaries: Sequence[JobSummary]
                ) -> dict[str, Any]:
    def partition(v: PartitionView) -> dict[str, Any]:
        out = asdict(v)
        for name in ("heartbeat_at", "throttled_until"):
            value = getattr(v, name)
            out[name] = value.isoformat() if value else None
        out["takeovers"] = v.takeovers
        return out

    return {"jobs": [asdict(s) for s in summaries],
            "partitions": [partition(v) for v in views]}

