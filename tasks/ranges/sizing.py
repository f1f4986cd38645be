"""Adaptive batch size (pt-archiver's `--chunk-time`): hold a target time per batch.

A job that declares `target_batch_s` starts at its `batch_size` (brought within its bounds)
and, after each batch, sizes the next one from the per-row time it just measured:

    next = target_batch_s / (seconds / rows)

clamped to `[min_batch_size, max_batch_size]`, grown at most `GROWTH` times per batch (one
fast batch, e.g. of rows already in the page cache, does not jump the size to the maximum),
shrunk at once (a batch that got slow is the one to correct quickly), and never so large that
a batch at the measured per-row time would outlast `LEASE_SHARE` of the lease TTL: a batch
runs between two lease checks, so a batch longer than the lease could lose the lease mid-way.

    target 0.5 s, rows cost 1 ms:   500 rows/batch -> 0.5 s
    rows now cost 10 ms:            the next batch of 500 takes 5 s; the one after: 50 rows
    lease TTL 3 s:                  never more than 1 s / 10 ms = 100 rows, whatever the target

Pure: `Sizer` holds numbers only; the caller times its batches and reports them.

A worker process runs one partition of a job after another, on rows that cost about the same.
`SETTLED` remembers, per job object, the size the last run in this process settled on, and the
next run starts there instead of ramping up from `batch_size` again (1,000, 4,000, 16,000 ...:
three small batches per partition). The bounds above still apply from its first batch, and a
slower partition shrinks the size after one batch as before.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

__all__ = ["Sizer", "Settled", "SETTLED", "validate_sizing", "GROWTH", "LEASE_SHARE"]

GROWTH = 4.0  # the most a batch grows over the previous one
LEASE_SHARE = 1 / 3  # a batch may take at most this share of the lease TTL


def validate_sizing(job: str, target_s: float | None, lo: int, hi: int) -> None:
    """ValueError naming the field when a job's adaptive sizing is declared wrong."""
    if target_s is not None and not (0 < target_s < math.inf):
        raise ValueError(f"range job {job}: target_batch_s must be a positive number of "
                         f"seconds, got {target_s!r}")
    if lo < 1:
        raise ValueError(f"range job {job}: min_batch_size must be at least 1, got {lo!r}")
    if hi < lo:
        raise ValueError(f"range job {job}: min_batch_size ({lo}) must not exceed "
                         f"max_batch_size ({hi})")


@dataclass
class Sizer:
    """The size of a run's next batch. Without `target_s` it stays `start` (fixed batches).

    `lease_ttl` bounds a batch's expected time to `LEASE_SHARE` of it.
    """

    start: int
    target_s: float | None = None
    lo: int = 1
    hi: int = 1_000_000
    lease_ttl: float = math.inf

    def __post_init__(self) -> None:
        self.size = self.start if self.target_s is None else min(max(self.start, self.lo), self.hi)
        self.per_row: float | None = None  # seconds per row in the last batch measured

    def observe(self, rows: int, seconds: float) -> int:
        """Take a committed batch of `rows` that took `seconds`; return the next size."""
        if self.target_s is None or rows <= 0:
            return self.size
        self.per_row = max(seconds, 1e-9) / rows
        wanted = self.target_s / self.per_row
        if rows >= self.size:  # only a full batch shows what a bigger one would cost
            wanted = min(wanted, self.size * GROWTH)
        else:
            wanted = min(wanted, self.size)
        size = min(max(wanted, self.lo), self.hi)
        # The lease comes first, even below `lo`: a batch that outlasts the lease never commits.
        self.size = max(int(min(size, self.lease_ttl * LEASE_SHARE / self.per_row)), 1)
        return self.size


class Settled:
    """The batch size each job's last run in this process settled on, by job object (a job
    re-declared, e.g. by a test, starts afresh: an entry holds its job by weak reference)."""

    def __init__(self) -> None:
        self._sizes: dict[int, tuple[weakref.ref[Any], int]] = {}

    def get(self, job: object) -> int | None:
        found = self._sizes.get(id(job))
        return found[1] if found is not None and found[0]() is job else None

    def put(self, job: object, size: int) -> None:
        self._sizes[id(job)] = (weakref.ref(job), size)


SETTLED = Settled()
