"""Partition planning: a pure function of the table's id bounds.

Partition `i` of size `s` covers ids `i*s + 1 .. (i+1)*s` (seed 000's pods), so a partition's
bounds never depend on when it was planned, and new partitions appear as the table grows.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Partition", "plan_partitions", "partition_of"]


class Partition(NamedTuple):
    part: int
    lo: int
    hi: int


def partition_of(row_id: int, size: int) -> int:
    """The index of the partition that holds `row_id` (ids start at 1)."""
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
