"""Adaptive batch size (issue 11): the sizing rule as a table, the declaration checks, and a
partition run on a real database whose per-row cost changes tenfold mid-run."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, Row
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import cm_data, mark_processed
from examples.seed import seed_cm_data
from lease import Leases
from tasks.ranges.jobs import Context
from tasks.ranges.runner import Outcome
from tasks.ranges.sizing import GROWTH, Sizer
from tests.ranges.inprocess import run_all


@pytest.fixture(params=["sqlite", "postgresql"])
def db_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.mark.parametrize(("sizer", "batches", "sizes"), [
    # no target: fixed batches whatever they cost
    (Sizer(100), [(100, 5.0), (100, 0.001)], [100, 100]),
    # 1 ms a row, target 0.5 s: grows at most GROWTH times a batch, then holds 500
    (Sizer(100, 0.5), [(100, 0.1), (400, 0.4), (500, 0.5)], [400, 500, 500]),
    # rows become ten times dearer: shrinks at once
    (Sizer(500, 0.5), [(500, 5.0)], [50]),
    # a short last batch never grows the size
    (Sizer(500, 0.5), [(10, 0.001)], [500]),
    # bounds: never above max nor below min
    (Sizer(100, 0.5, 20, 300), [(100, 0.01), (300, 0.03), (300, 30.0)], [300, 300, 20]),
    # the start size is brought within the bounds
    (Sizer(5, 0.5, 20, 300), [], []),
    # the lease: at 10 ms a row and TTL 3 s no batch above 100 rows (1 s), even below min
    (Sizer(100, 10.0, 1, 10_000, lease_ttl=3.0), [(100, 1.0)], [100]),
    (Sizer(100, 10.0, 200, 10_000, lease_ttl=3.0), [(200, 2.0)], [100]),
])
def test_the_next_batch_size(sizer: Sizer, batches: list[tuple[int, float]],
                             sizes: list[int]) -> None:
    assert [sizer.observe(rows, seconds) for rows, seconds in batches] == sizes
    if not batches:
        assert sizer.size == 20


def test_growth_is_bounded_per_batch() -> None:
    sizer = Sizer(10, 1.0, 1, 10**9)
    assert sizer.observe(10, 1e-6) == 10 * GROWTH


@pytest.mark.parametrize(("changes", "field"), [
    ({"target_batch_s": 0}, "target_batch_s"),
    ({"target_batch_s": -1.0}, "target_batch_s"),
    ({"target_batch_s": float("nan")}, "target_batch_s"),
    ({"min_batch_size": 500, "max_batch_size": 100}, "min_batch_size"),
    ({"min_batch_size": 0}, "min_batch_size"),
])
def test_bad_declarations_are_refused_naming_the_field(changes: dict[str, Any],
                                                       field: str) -> None:
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(cm_data, name="adaptive_bad", **changes)


TARGET = 0.1  # seconds per batch
CHEAP, DEAR = 0.0002, 0.002  # seconds per row below and above SWITCH: ten times dearer
SWITCH, ROWS = 1500, 3000


def test_batch_times_return_to_the_target_after_rows_get_ten_times_dearer(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, ROWS)
    seen: list[tuple[int, int, float]] = []  # (first id, rows, seconds) of each batch
    # Batches are timed on a clock only the rows' cost moves, so their times are exact however
    # busy the machine (a sleep overshoots under load and the sizer rightly follows it).
    clock = [0.0]

    def costly(rows: Sequence[Row[Any]], ctx: Context) -> None:
        cost = sum(DEAR if r.id > SWITCH else CHEAP for r in rows)
        clock[0] += cost
        mark_processed(rows, ctx)
        seen.append((rows[0].id, len(rows), cost))

    job = dataclasses.replace(cm_data, name="adaptive", process=costly, batch_size=100,
                              parallelism=1, partition_size=ROWS, target_batch_s=TARGET,
                              min_batch_size=5, max_batch_size=2000)
    assert run_all(job, sessions, leases, redis_client, lambda: clock[0]) == [Outcome.DONE]
    assert sum(rows for _, rows, _ in seen) == ROWS
    # Between the bounds; only the partition's tail (the last batch) may hold fewer rows.
    assert all(5 <= rows <= 2000 for _, rows, _ in seen[:-1]), seen
    assert 1 <= seen[-1][1] <= 2000, seen
    cheap = [s for first, rows, s in seen if first + rows - 1 <= SWITCH]  # ids are 1..ROWS
    assert near(cheap[-2:]), seen  # held the target before the change
    change = len(cheap)  # the batch that reached the dear rows, sized for cheap ones: slow
    assert seen[change][2] > 2 * TARGET, seen
    # within three batches the times are back near the target, and stay there
    assert near([s for _, _, s in seen[change + 3:change + 13]], outliers=1), seen
    assert max(rows for _, rows, _ in seen[change + 3:]) < min(len_ for _, len_, _ in
                                                              seen[change - 2:change]), seen

def test_the_maximum_holds_even_when_batches_are_fast(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 2000)
    sizes: list[int] = []

    def record(rows: Sequence[Row[Any]], ctx: Context) -> None:
        sizes.append(len(rows))
        mark_processed(rows, ctx)

    job = dataclasses.replace(cm_data, name="adaptive_max", process=record, batch_size=50,
                              parallelism=1, partition_size=2000, target_batch_s=5.0,
                              min_batch_size=10, max_batch_size=300)
    assert run_all(job, sessions, leases, redis_client) == [Outcome.DONE]
    assert sizes[:3] == [50, 200, 300] and max(sizes) == 300 and sum(sizes) == 2000


def test_the_next_partition_of_a_job_starts_at_the_size_the_last_one_settled_on(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 2000)
    firsts: list[tuple[int, int]] = []  # (first id, rows) of each batch

    def record(rows: Sequence[Row[Any]], ctx: Context) -> None:
        firsts.append((rows[0].id, len(rows)))
        mark_processed(rows, ctx)

    job = dataclasses.replace(cm_data, name="adaptive_carry", process=record, batch_size=50,
                              parallelism=1, partition_size=1000, target_batch_s=5.0,
                              min_batch_size=10, max_batch_size=300)
    assert run_all(job, sessions, leases, redis_client) == [Outcome.DONE, Outcome.DONE]
    first_of_part = [rows for first, rows in firsts if first in (1, 1001)]
    assert first_of_part == [50, 300], firsts  # ramped once, then carried over
    # The same job re-declared (another object) ramps from its batch_size again.
    firsts.clear()
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE cm_data SET status = 0")
    again = dataclasses.replace(job, name="adaptive_carry_again")
    assert run_all(again, sessions, leases, redis_client) == [Outcome.DONE, Outcome.DONE]
    assert [rows for first, rows in firsts if first in (1, 1001)] == [50, 300], firsts


def near(times: list[float], outliers: int = 0) -> bool:
    """At most `outliers` of `times` are more than 50% off the target."""
    return bool(times) and sum(abs(t - TARGET) > TARGET / 2 for t in times) <= outliers

