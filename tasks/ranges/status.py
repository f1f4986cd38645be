"""`python -m tasks status`, range jobs: every partition of every range job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rich.console import Console
from rich.table import Table
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tasks.models import WORK

__all__ = ["PartitionView", "partitions", "render"]


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

    @property
    def takeovers(self) -> int:
        """Claims beyond the first: each one is a handover or a failover."""
        return max(self.claims - 1, 0)


def partitions(sessions: sessionmaker[Session], job: str | None = None) -> list[PartitionView]:
    query = select(WORK).where(WORK.c.kind == "range").order_by(WORK.c.job, WORK.c.part)
    if job is not None:
        query = query.where(WORK.c.job == job)
    with sessions() as session:
        rows = session.execute(query).all()
    return [PartitionView(r.job, r.part, r.lo, r.hi, r.status, r.owner, r.next_id, r.rows_done,
                          r.rate, r.fence, r.claims, r.error, r.heartbeat_at) for r in rows]


def render(views: Sequence[PartitionView], console: Console | None = None) -> None:
    console = console or Console()
    if not views:
        console.print("no range job has partitions yet "
                      "(start one: celery -A tasks call tasks.ranges.start --args '[\"cm_data\"]')")
        return
    table = Table(title="range partitions")
    for column in ("job", "part", "ids", "state", "owner", "checkpoint", "rows done", "rows/s",
                   "fence", "takeovers"):
        table.add_column(column, justify="right" if column not in ("job", "state", "owner")
                         else "left")
    for v in views:
        state = v.status if v.status != "failed" else f"failed: {v.error}"
        table.add_row(v.job, str(v.part), f"{v.lo}..{v.hi}", state, v.owner or "-",
                      str(v.checkpoint), str(v.rows_done), f"{v.rows_per_s:,.0f}", str(v.fence),
                      str(v.takeovers))
    console.print(table)
