"""The range jobs' status view, plain data: a summary per job, with totals per partition state.
The CLI draws it (`tasks.cli.render`), `python -m tasks status --json` and the console
serialise it; the partitions themselves are listed a page at a time (`tasks.ranges.paging`,
which also writes the range part of `status --json`).

A job's progress is read from its partitions by one aggregate query (GROUP BY job and state:
its cost is one pass of the index, its answer a few rows per job however many partitions
there are; no scan of the job's table):

- rows done: the rows its partitions processed in the current run (`rows_done`, committed
  with each batch's checkpoint; a new run walks the stored plan again from zero,
  `tasks.ranges.workrow.restart_finished`), and the rows its skip policy quarantined
  (`rows_skipped`);
- ids walked of ids planned: the planned id space (`hi - lo + 1` of every partition) is an
  upper bound of the rows the job can process; a finished partition counts whole, an open one
  up to its checkpoint;
- rows/s: the sum of the rates of its running partitions;
- ETA: the ids left, at the rate ids are being walked (rows/s times ids walked per row done so
  far). An estimate: it assumes the rest of the table matches the filter as densely as the
  part already walked. No ETA while nothing runs or nothing has been processed yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib import import_module
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement

from tasks.config.clock import iso
from tasks.ranges.tables import WORK, PartitionStatus
from tasks.ranges.workrow import every_partition

if TYPE_CHECKING:
    from sqlalchemy.engine import Row

__all__ = ["PartitionView", "StateTotals", "JobSummary", "view_of", "partitions",
           "job_summaries", "summarize", "format_eta"]


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
    rows_skipped: int = 0  # the current run's rows quarantined by the skip policy

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
            out[name] = iso(value)
        out["takeovers"] = self.takeovers
        return out


@dataclass(frozen=True)
class StateTotals:
    """The partitions of one job in one state, added up: how many, their rows done, the ids
    they plan and the ids walked, and (running ones only) their rows/s."""

    partitions: int
    rows_done: int
    ids_planned: int
    ids_walked: int
    rows_per_s: float = 0.0
    rows_skipped: int = 0


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
    run: int | None = None  # the current run's number in the job (1, 2, ...), if it has one
    throttle_rows_per_s: float | None = None  # the run's rows/s cap (None: not throttled)
    # Per partition state: its totals (`partitions` above is their counts, kept for readers of
    # the shape before issue 20).
    states: dict[str, StateTotals] = field(default_factory=dict)
    rows_skipped: int = 0  # the current run's rows quarantined and not retried

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


def view_of(r: Row[Any]) -> PartitionView:
    """The view of one work row (a `SELECT` of `WORK`'s columns)."""
    return PartitionView(r.job, r.part, r.lo, r.hi, r.status, r.owner, r.next_id, r.rows_done,
                         r.rate, r.fence, r.claims, r.error, r.heartbeat_at,
                         getattr(r, "throttled_until", None), int(getattr(r, "rows_skipped", 0)))


def partitions(sessions: sessionmaker[Session], job: str | None = None) -> list[PartitionView]:
    """Every range partition (of `job`, when given), ordered by job and part: one query. For
    tests and small jobs; operators' views read a page (`tasks.ranges.paging`)."""
    query = select(WORK).where(every_partition()).order_by(WORK.c.job, WORK.c.part)
    if job is not None:
        query = query.where(WORK.c.job == job)
    with sessions() as session:
        rows = session.execute(query).all()
    return [view_of(r) for r in rows]


def _ids_walked() -> ColumnElement[int]:
    """`PartitionView.ids_walked` in SQL: whole once finished, else checkpoint - lo within
    0..size."""
    w = WORK.c
    size, behind = w.hi - w.lo + 1, w.next_id - w.lo
    return case((w.status.in_((PartitionStatus.DONE, PartitionStatus.EMPTY)), size),
                (behind < 0, 0), (behind > size, size), else_=behind)


def job_summaries(sessions: sessionmaker[Session], job: str | None = None
                  ) -> list[JobSummary]:
    """A summary per job that has partitions (only `job`, when given), ordered by job: one
    GROUP BY query over the work rows, then the current run of each job."""
    w = WORK.c
    query = (select(w.job, w.status, func.count(), func.sum(w.rows_done),
                    func.sum(w.hi - w.lo + 1), func.sum(_ids_walked()), func.sum(w.rate),
                    func.sum(w.rows_skipped))
             .where(every_partition()).group_by(w.job, w.status))
    if job is not None:
        query = query.where(w.job == job)
    with sessions() as session:
        rows = session.execute(query).all()
    totals: dict[str, dict[str, StateTotals]] = {}
    for name, state, count, rows_done, planned, walked, rate, skipped in rows:
        running = state == PartitionStatus.RUNNING
        totals.setdefault(name, {})[state] = StateTotals(
            int(count), int(rows_done or 0), int(planned or 0), int(walked or 0),
            float(rate or 0.0) if running else 0.0, int(skipped or 0))
    return _summaries(totals, sessions)


def summarize(views: Sequence[PartitionView],
              sessions: sessionmaker[Session] | None = None) -> list[JobSummary]:
    """A summary per job of `views`, added up in Python the way `job_summaries` adds them up
    in SQL (the run's state and throttle from the run history when `sessions` is given)."""
    totals: dict[str, dict[str, StateTotals]] = {}
    for v in views:
        states = totals.setdefault(v.job, {})
        seen = states.get(v.status, StateTotals(0, 0, 0, 0))
        rate = v.rows_per_s if v.status == PartitionStatus.RUNNING else 0.0
        states[v.status] = StateTotals(seen.partitions + 1, seen.rows_done + v.rows_done,
                                       seen.ids_planned + v.hi - v.lo + 1,
                                       seen.ids_walked + v.ids_walked, seen.rows_per_s + rate,
                                       seen.rows_skipped + v.rows_skipped)
    return _summaries(totals, sessions)


def _summaries(totals: dict[str, dict[str, StateTotals]],
               sessions: sessionmaker[Session] | None) -> list[JobSummary]:
    runs = _current_runs(sessions, {
        job: (sum(s.rows_done for s in states.values()),
              sum(s.rows_skipped for s in states.values()))
        for job, states in totals.items()})
    return [_summary(job, states, runs.get(job)) for job, states in sorted(totals.items())]


def _summary(job: str, states: dict[str, StateTotals], run: Any) -> JobSummary:
    """A job's summary from its totals per state and its current run (None: none recorded)."""
    rows = sum(s.rows_done for s in states.values())
    walked = sum(s.ids_walked for s in states.values())
    planned = sum(s.ids_planned for s in states.values())
    rate = sum(s.rows_per_s for s in states.values())
    eta = None
    if rate > 0 and rows > 0 and walked < planned:
        eta = (planned - walked) / (rate * walked / rows)
    counts = {state: states[state].partitions for state in sorted(states)}
    state = getattr(run, "state", None) or _derived_state(counts)
    return JobSummary(job, str(state), rows, walked, planned, rate, eta, counts,
                      getattr(run, "shown", None), getattr(run, "rows_per_s", None),
                      {state: states[state] for state in sorted(states)},
                      sum(s.rows_skipped for s in states.values()))


def _derived_state(states: dict[str, int]) -> str:
    """A job's state when no run is recorded: from its partitions' counts per state."""
    if states.get(PartitionStatus.RUNNING):
        return "running"
    open_states = [s for s in states if s not in PartitionStatus.FINISHED]
    if open_states:
        return "pending" if set(open_states) == {PartitionStatus.PENDING} else open_states[0]
    return "failed" if states.get(PartitionStatus.FAILED) else "done"


def _current_runs(sessions: sessionmaker[Session] | None,
                  counts: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """Each job's current run from the wing's run history (`tasks.ranges.runs.current_runs`,
    one read for every job, given the rows their partitions counted; looked up by name so this
    view also works on a schema without it), or none."""
    if sessions is None:
        return {}
    try:
        current_runs = getattr(import_module("tasks.ranges.runs"), "current_runs", None)
    except ImportError:
        return {}
    if current_runs is None:
        return {}
    found: dict[str, Any] = current_runs(sessions, counts)
    return found


def format_eta(seconds: float | None) -> str:
    """An estimate in seconds as the operator reads it: `1h02m`, `3m05s`, `45s`, or `-`."""
    if seconds is None:
        return "-"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes \
        else f"{secs}s"
