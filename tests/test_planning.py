"""Partition planning is pure: tables and properties, no database."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.planning import Partition, partition_of, plan_partitions


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
