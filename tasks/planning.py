"""Partition planning: pure functions of the table's id bounds and the plan stored so far.

A plan is data. The first round plans partition `i` of size `s` as ids `i*s + 1 .. (i+1)*s`
(seed 000's pods); from then on the stored partitions are never recut, and partitions for a
grown table are appended after the last stored `hi` with the size in force at that moment, so
changing a job's partition size can never make two partitions overlap.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Partition", "plan_partitions", "plan_after", "partition_of"]


class Partition(NamedTuple):
    part: int
    lo: int
    hi: int


def partition_of(row_id: int, size: int) -> int:
    """The index of the partition that holds `row_id` in a first plan (ids start at 1)."""
    if size <= 0:
        raise ValueError(f"partition size must be positive, got {size}")
    return max(row_id - 1, 0) // size


def plan_partitions(min_id: int | None, max_id: int | None, size: int) -> list[Partition]:
    """Every partition that holds an id in `min_id .. max_id`; none for an empty table."""
    if size <= 0:
        raise ValueError(f"partition size must be positive, got {size}")
    if min_id is None or max_id is None:
        return []
    if min_id > max_id:
        raise ValueError(f"min_id {min_id} is above max_id {max_id}")
    first, last = partition_of(min_id, size), partition_of(max_id, size)
    return [Partition(i, i * size + 1, (i + 1) * size) for i in range(first, last + 1)]


def plan_after(last: Partition | None, min_id: int | None, max_id: int | None,
               size: int) -> list[Partition]:
    """The partitions to add to a stored plan whose last partition is `last` (None: no plan
    yet), so that every id up to `max_id` is covered; none if it already is."""
    if last is None:
        return plan_partitions(min_id, max_id, size)
    if size <= 0:
        raise ValueError(f"partition size must be positive, got {size}")
    if max_id is None or max_id <= last.hi:
        return []
    count = -(-(max_id - last.hi) // size)  # ceil
    return [Partition(last.part + 1 + i, last.hi + 1 + i * size, last.hi + (i + 1) * size)
            for i in range(count)]
