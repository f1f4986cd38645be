"""The range jobs' status view, plain data: a summary per job and every partition. The CLI draws
it (`tasks.cli.render`), `python -m tasks status --json` and the console serialise it.

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

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.tables import WORK, PartitionStatus
from tasks.ranges.workrow import every_partition

__all__ = ["PartitionView", "JobSummary", "partitions", "summarize", "ranges_json",
           "format_eta"]


@dataclass(frozen=True)
class PartitionView:
    """One partition of a range job, as its work row says."""

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

    @property
    def share(self) -> float:
        """The part of lo..hi walked, 0.0 to 1.0 (a partition planning no id is whole)."""
        return self.ids_walked / (self.hi - self.lo + 1) if self.hi >= self.lo else 1.0

    def as_dict(self) -> dict[str, Any]:
        """The view as JSON-able values (`status --json`): its fields, times in ISO 8601, and
        `takeovers`."""
        out = asdict(self)
        for name in ("heartbeat_at", "throttled_until"):
            value = getattr(self, name)
            out[name] = value.isoformat() if value else None
        out["takeovers"] = self.takeovers
        return out


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

    @classmethod
    def never_started(cls, job: str) -> JobSummary:
        """A registered job with no partition yet."""
        return cls(job, "never started", 0, 0, 0, 0.0, None, {})

    @property
    def share(self) -> float:
        """The part of the planned ids walked, 0.0 to 1.0: nothing before a job has
        partitions, whole when its partitions plan no id."""
        if self.ids_planned:
            return self.ids_walked / self.ids_planned
        return 1.0 if self.partitions else 0.0

    @property
    def eta(self) -> str:
        """`eta_s` as text (`1h02m`, `3m05s`, `-` when there is no estimate)."""
        return format_eta(self.eta_s)

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-able values (`status --json`): its fields."""
        return asdict(self)


def partitions(sessions: sessionmaker[Session], job: str | None = None) -> list[PartitionView]:
    """Every range partition (of `job`, when given), ordered by job and part: one query."""
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
    """An estimate in seconds as the operator reads it: `1h02m`, `3m05s`, `45s`, or `-`."""
    if seconds is None:
        return "-"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes \
        else f"{secs}s"


def ranges_json(views: Sequence[PartitionView], summaries: Sequence[JobSummary]
                ) -> dict[str, Any]:
    """The `jobs` and `partitions` of `status --json`."""
    return {"jobs": [s.as_dict() for s in summaries],
            "partitions": [v.as_dict() for v in views]}
