"""Partition planning is pure: tables and properties, no database."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.ranges.planning import Partition, StoredPlan, partition_of, plan_after, plan_partitions


@pytest.mark.parametrize(
    ("min_id", "max_id", "size", "expected"),
    [
        (None, None, 10, []),
        (1, 1, 10, [Partition(0, 1, 10)]),
        (1, 10, 10, [Partition(0, 1, 10)]),
        (1, 11, 10, [Partition(0, 1, 10), Partition(1, 11, 20)]),
        (15, 35, 10, [Partition(1, 11, 20), Partition(2, 21, 30), Partition(3, 31, 40)]),
        (1, 4_000_000, 2_000_000, [Partition(0, 1, 2_000_000),
                                   Partition(1, 2_000_001, 4_000_000)]),
    ],
)
def test_plan(min_id: int | None, max_id: int | None, size: int,
              expected: list[Partition]) -> None:
    assert plan_partitions(min_id, max_id, size) == expected


@pytest.mark.parametrize(("min_id", "max_id", "size"), [(1, 10, 0), (1, 10, -5), (10, 1, 5)])
def test_bad_bounds_are_rejected(min_id: int, max_id: int, size: int) -> None:
    with pytest.raises(ValueError):
        plan_partitions(min_id, max_id, size)


@given(st.integers(1, 10**9), st.floats(0, 50), st.integers(1, 10**6))
def test_partitions_tile_the_ids_without_gaps_or_overlaps(lo: int, spans: float, size: int) -> None:
    hi = lo + int(spans * size)
    parts = plan_partitions(lo, hi, size)
    assert parts[0].lo <= lo and parts[-1].hi >= hi
    for a, b in zip(parts, parts[1:], strict=False):
        assert a.hi + 1 == b.lo and b.part == a.part + 1
    for p in parts:
        assert p.hi - p.lo + 1 == size
        assert partition_of(p.lo, size) == partition_of(p.hi, size) == p.part


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.integers(1, 10**4))
def test_growth_only_adds_partitions(max_a: int, grow: int, size: int) -> None:
    size = max(size, (max_a + grow) // 100)  # at most ~100 partitions per example
    before = plan_partitions(1, max_a, size)
    after = plan_partitions(1, max_a + grow, size)
    assert after[: len(before)] == before


@pytest.mark.parametrize(
    ("stored", "min_id", "max_id", "size", "expected"),
    [
        (None, 1, 15, 10, [Partition(0, 1, 10), Partition(1, 11, 20)]),
        (StoredPlan(1, 100, 0), 1, 100, 50, []),  # the resize: nothing recut
        (StoredPlan(1, 100, 0), 1, 101, 50, [Partition(1, 101, 150)]),
        (StoredPlan(1, 100, 0), 1, 200, 50, [Partition(1, 101, 150), Partition(2, 151, 200)]),
        (StoredPlan(31, 40, 3), 31, 41, 1000, [Partition(4, 41, 1040)]),
        (StoredPlan(101, 200, 0), 40, 200, 50, [Partition(1, 51, 100), Partition(2, 1, 50)]),
        (StoredPlan(1, 100, 0), None, None, 50, []),
    ],
)
def test_plan_after(stored: StoredPlan | None, min_id: int | None, max_id: int | None,
                    size: int, expected: list[Partition]) -> None:
    assert plan_after(stored, min_id, max_id, size) == expected


@given(st.lists(st.tuples(st.integers(-300, 500), st.integers(1, 100)), min_size=1,
                max_size=20))
def test_a_plan_grown_with_changing_sizes_covers_every_id_once(
    steps: list[tuple[int, int]]
) -> None:
    """Each step moves the table's min or max id by `delta` and plans with size `size`."""
    plan: list[Partition] = []
    min_id = max_id = 1000
    for delta, size in steps:
        if delta < 0:
            min_id += delta
        else:
            max_id += delta
        stored = (StoredPlan(min(p.lo for p in plan), max(p.hi for p in plan),
                             max(p.part for p in plan)) if plan else None)
        plan += plan_after(stored, min_id, max_id, size)
    ordered = sorted(plan, key=lambda p: p.lo)
    assert ordered[0].lo <= min_id and ordered[-1].hi >= max_id
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert a.hi + 1 == b.lo  # no gap, no overlap
    assert sorted(p.part for p in plan) == list(range(plan[0].part, plan[0].part + len(plan)))
