"""How a partition run ends: its `Outcome`, the `Progress` it reports, and the exceptions that
stop a batch (`FencedOut`, `FilterNotCleared`) or refuse a run (`UnknownPartition`)."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.ranges.jobs import InvalidArguments
from tasks.ranges.tables import PartitionStatus as S

__all__ = ["Outcome", "Progress", "UnknownPartition", "FencedOut", "FilterNotCleared"]


class Outcome:
    """How a run of `PartitionRunner` ended."""

    BUSY = "busy"  # another worker holds the lease (a duplicate delivery)
    FINISHED = "finished"  # the partition was already done, empty or failed
    STALE = "stale"  # a newer holder claimed the row first
    DONE = S.DONE
    EMPTY = S.EMPTY
    FAILED = S.FAILED
    HANDED_OVER = "handed-over"  # stopped early on purpose; back to pending
    FENCED_OUT = "fenced-out"  # a newer holder took over; nothing of ours was written
    LOST = "lost"  # the lease was lost between batches; back to pending
    UNAVAILABLE = "db-unavailable"  # the database stayed away; handed back (no crash)
    REDIS_UNAVAILABLE = "redis-unavailable"  # Redis was away; back to pending if possible
    PAUSED = S.PAUSED  # the job was paused or cancelled: stopped at a batch boundary
    # Stopped at a batch boundary to adopt a partition whose holder died (back to pending and
    # dispatched again; the caller runs the orphan next, ahead of the queued fresh work).
    YIELDED = "yielded"


@dataclass
class Progress:
    """What a run reports after each committed batch (Flower shows it as task state)."""

    job: str
    part: int
    checkpoint: int
    hi: int
    rows_done: int
    rows_per_s: float


class UnknownPartition(InvalidArguments):
    """The partition was never planned (the reconciler plans partitions from the id bounds)."""


class FencedOut(Exception):
    """A newer lease holder claimed the partition; this holder's batch was rolled back."""


class FilterNotCleared(Exception):
    """The job's process function left a processed row matching the job's filter."""
