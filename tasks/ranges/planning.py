"""Partition planning: pure functions of the table's id bounds and the plan stored so far.

A plan is data. The first round plans partition `i` of size `s` as ids `i*s + 1 .. (i+1)*s`
(the design's fixed pods); from then on the stored partitions are never recut, and partitions for a
grown table are added after the highest stored `hi` (or below the lowest `lo`) with the size
in force at that moment, so changing a job's partition size can never make two overlap.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Partition", "StoredPlan", "plan_partitions", "plan_after", "partition_of",
           "plan_by_rows", "plan_keyed"]


class Partition(NamedTuple):
    """Ids `lo..hi`; for a keyed job (tasks.ranges.jobkeys) the keys `lo_key < key <= hi_key`
    (None: unbounded), `lo..hi` then the row ordinals the plan counted in it."""

    part: int
    lo: int
    hi: int
    lo_key: tuple[Any, ...] | None = None
    hi_key: tuple[Any, ...] | None = None


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


class StoredPlan(NamedTuple):
    """What a job's stored partitions cover: ids `lo..hi`, partition numbers up to `last_part`."""

    lo: int
    hi: int
    last_part: int


def plan_after(stored: StoredPlan | None, min_id: int | None, max_id: int | None,
               size: int) -> list[Partition]:
    """The partitions to add to a stored plan so that every id in `min_id .. max_id` is
    covered: none if it already is. New partitions lie below the stored `lo` (rows inserted
    later with smaller explicit ids) or above the stored `hi` (the table grew), never across a
    stored partition, and are numbered after `last_part`. `stored` None: a first plan."""
    if stored is None:
        return plan_partitions(min_id, max_id, size)
    if size <= 0:
        raise ValueError(f"partition size must be positive, got {size}")
    if min_id is None or max_id is None:
        return []
    below = -(-(stored.lo - min_id) // size) if min_id < stored.lo else 0  # ceil
    above = -(-(max_id - stored.hi) // size) if max_id > stored.hi else 0
    los = [stored.lo - (i + 1) * size for i in range(below)]
    los += [stored.hi + 1 + i * size for i in range(above)]
    return [Partition(stored.last_part + 1 + n, lo, lo + size - 1) for n, lo in enumerate(los)]


def plan_by_rows(min_id: int, max_id: int, cuts: list[int]) -> list[Partition]:
    """A first plan of an integer key cut by row count: `cuts` are the last id of each
    partition but the last (ascending, from a walk of the index), the last ends at
    `max_id`."""
    his = [c for c in cuts if min_id <= c < max_id] + [max_id]
    los = [min_id] + [c + 1 for c in his[:-1]]
    return [Partition(i, lo, hi) for i, (lo, hi) in enumerate(zip(los, his, strict=True))]


def plan_keyed(cuts: list[tuple[Any, ...]], rows: int, step: int) -> list[Partition]:
    """A keyed job's plan from `cuts`, the last key of each partition but the last (from a
    walk of `step` rows at a time over `rows` rows): the first partition has no lower bound
    and the last no upper one, so every key lies in exactly one. `lo..hi` are the ordinals
    of the rows the walk counted in each."""
    if rows <= 0:
        return []
    bounds: list[tuple[Any, ...] | None] = [None, *cuts, None]
    return [Partition(i, i * step + 1, rows if i == len(cuts) else (i + 1) * step,
                      bounds[i], bounds[i + 1]) for i in range(len(cuts) + 1)]
