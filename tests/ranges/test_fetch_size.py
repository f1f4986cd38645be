"""A batch bigger than its job's `fetch_size` (tasks/ranges/jobs.py), in-process on a real Redis
and all three databases: it is read and processed that many rows at a time, yet it stays one
transaction with one checkpoint, so a fence lost or an error after its first read keeps
nothing of it, and the skip policy counts every read of it against its limit."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, Row, update
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import cm_data, mark_processed
from examples.seed import seed_cm_data
from lease import Leases
from tasks.ranges.jobs import Context, RangeJob
from tasks.ranges.runner import Outcome
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tests.ranges.test_runner import counts, plan, runner, work
from tests.ranges.test_skips import BadRow, letters, picky, processed


def fetching(**changes: Any) -> RangeJob:
    options: dict[str, Any] = {"partition_size": 1000, "batch_size": 250, "fetch_size": 60,
                               "parallelism": 1, "target_batch_s": None}
    return dataclasses.replace(cm_data, **{**options, **changes})


def run_first(job: RangeJob, sessions: sessionmaker[Session], leases: Leases,
              client: redis.Redis) -> str:
    """Plan `job` and run its partition 0 here; the outcome."""
    plan(sessions, client, job)
    return runner(job, 0, sessions, leases).run()


class Calls:
    """What a process function saw: each call's row ids and its batch's session."""

    def __init__(self) -> None:
        self.sessions: list[Session] = []  # kept alive, so identities are not reused
        self.ids: list[list[int]] = []

    def __call__(self, rows: Sequence[Row[Any]], ctx: Context) -> None:
        self.sessions.append(ctx.session)
        self.ids.append([r.id for r in rows])
        mark_processed(rows, ctx)

    def per_batch(self) -> list[list[int]]:
        """The sizes of the calls, grouped by the batch (transaction) they ran in."""
        batches: list[list[int]] = []
        for i, ids in enumerate(self.ids):
            if i == 0 or self.sessions[i] is not self.sessions[i - 1]:
                batches.append([])
            batches[-1].append(len(ids))
        return batches


def test_a_batch_is_read_and_processed_fetch_size_rows_at_a_time_in_one_transaction(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 1000)
    calls = Calls()
    job = fetching(process=calls)
    assert run_first(job, sessions, leases, redis_client) == Outcome.DONE
    assert counts(engine) == {1: 1000}
    # Four batches of 250 rows, each four reads of 60 and one of 10, in id order.
    assert calls.per_batch() == [[60, 60, 60, 60, 10]] * 4
    assert [i for ids in calls.ids for i in ids] == list(range(1, 1001))
    row = work(engine, 0)
    assert (row.status, row.rows_done, row.next_id) == (S.DONE, 1000, 1001)


def test_a_short_read_inside_a_batch_ends_the_keyset_pass(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 130)
    calls = Calls()
    job = fetching(process=calls)
    assert run_first(job, sessions, leases, redis_client) == Outcome.DONE
    assert calls.per_batch() == [[60, 60, 10]]  # no empty read after the short one
    assert counts(engine) == {1: 130}
    assert work(engine, 0).rows_done == 130


def test_a_fence_lost_after_the_first_read_of_a_batch_keeps_nothing_of_it(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 1000)
    seen = Calls()

    def overtaken(rows: Sequence[Row[Any]], ctx: Context) -> None:
        seen(rows, ctx)
        if len(seen.ids) == 7:  # batch 2's second read: a newer holder claims the row
            ctx.session.execute(update(WORK).where(WORK.c.part == 0)
                                .values(fence=ctx.fence + 1))

    job = fetching(process=overtaken)
    assert run_first(job, sessions, leases, redis_client) == Outcome.FENCED_OUT
    # Batch 1 committed; batch 2 (ids 251..500) wrote nothing, its first read included.
    done = processed(engine)
    assert {i for i, n in done.items() if n == 1} == set(range(1, 251))
    assert all(done[i] == 0 for i in range(251, 1001))
    assert work(engine, 0).next_id == 251 and work(engine, 0).rows_done == 250


def test_an_error_in_a_later_read_of_a_batch_rolls_back_its_earlier_reads(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 1000)
    seen = Calls()

    def breaks(rows: Sequence[Row[Any]], ctx: Context) -> None:
        seen(rows, ctx)
        if len(seen.ids) == 8:  # batch 2's third read
            raise RuntimeError("the job broke on its eighth call")

    job = fetching(process=breaks)
    assert run_first(job, sessions, leases, redis_client) == Outcome.FAILED
    done = processed(engine)
    assert {i for i, n in done.items() if n == 1} == set(range(1, 251))
    row = work(engine, 0)
    assert row.status == S.FAILED and "eighth call" in row.error
    assert (row.next_id, row.rows_done) == (251, 250)


def test_skips_across_the_reads_of_one_batch_count_against_one_limit(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 1000)
    # 10, 70 and 130 lie in three reads of batch 1; 700 in batch 3.
    job = fetching(process=picky({10, 70, 130, 700}), skip_on=(BadRow,), skip_limit=4)
    assert run_first(job, sessions, leases, redis_client) == Outcome.DONE
    done = processed(engine)
    assert {i for i, n in done.items() if n != 1} == {10, 70, 130, 700}
    assert [f["row_id"] for f in letters(engine)] == [10, 70, 130, 700]
    assert work(engine, 0).rows_done == 996


def test_a_batch_past_the_skip_limit_over_several_reads_fails_whole(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 1000)
    # Three bad rows in three reads of batch 1, limit 2: the third read is past the limit.
    job = fetching(process=picky({10, 70, 130}), skip_on=(BadRow,), skip_limit=2)
    assert run_first(job, sessions, leases, redis_client) == Outcome.FAILED
    row = work(engine, 0)
    assert "SkipLimitExceeded" in row.error and "skip_limit=2" in row.error
    assert set(processed(engine).values()) == {0}  # batch 1 rolled back whole
    assert letters(engine) == []


@pytest.mark.parametrize("bad", [0, -5])
def test_a_fetch_size_that_is_not_positive_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="fetch_size must be positive"):
        fetching(fetch_size=bad)
