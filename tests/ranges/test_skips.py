"""The skip policy (issue 11): bad rows are quarantined as dead letters and the partition goes
on, up to its job's skip limit; on real SQLite and PostgreSQL, with a real Redis."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, Row, func, select
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import cm_data, mark_processed
from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from lease import Leases
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.ranges.jobs import Context, RangeJob
from tasks.ranges.reconciler import activate, reconcile_job
from tasks.ranges.runner import Outcome, PartitionRunner
from tasks.ranges.skips import SKIP_KIND
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tests.ranges.inprocess import run_all


@pytest.fixture(params=["sqlite", "postgresql"])
def db_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


class BadRow(ValueError):
    """What the test job raises for a row it cannot process."""


def picky(bad: set[int]) -> Any:
    """A process function that writes its batch, then raises for a bad row in it (so the
    skip policy must roll back what the batch wrote, not just avoid writing)."""

    def process(rows: Sequence[Row[Any]], ctx: Context) -> None:
        mark_processed(rows, ctx)
        found = sorted(r.id for r in rows if r.id in bad)
        if found:
            raise BadRow(f"row {found[0]} has a bad payload")

    return process


def skipping(bad: set[int], limit: int, **changes: Any) -> RangeJob:
    options: dict[str, Any] = {"partition_size": 500, "batch_size": 100, "parallelism": 1}
    return dataclasses.replace(cm_data, process=picky(bad), skip_on=(BadRow,),
                               skip_limit=limit, **{**options, **changes})



def processed(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(i): int(n) for i, n in conn.execute(
            select(CM_DATA.c.id, CM_DATA.c.processed_count))}


def letters(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(select(DEAD_LETTERS.c.kind, DEAD_LETTERS.c.ref,
                                   DEAD_LETTERS.c.reason, DEAD_LETTERS.c.payload)
                            .order_by(DEAD_LETTERS.c.id)).all()
    return [{"kind": r.kind, "ref": r.ref, "reason": r.reason, **json.loads(r.payload)}
            for r in rows]


def work_rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(WORK.c.part, WORK.c.status, WORK.c.rows_done,
                                        WORK.c.error).order_by(WORK.c.part)))


BAD = {7, 333, 334, 999}  # 7 and 333-334 in partition 0 (ids 1..500), 999 in partition 1


def test_bad_rows_are_quarantined_and_every_other_row_is_processed_once(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 1000)
    job = skipping(BAD, limit=3)
    assert run_all(job, sessions, leases, redis_client) == [Outcome.DONE, Outcome.DONE]
    counts = processed(engine)
    assert {i for i, n in counts.items() if n != 1} == BAD
    assert all(counts[i] == 0 for i in BAD)
    found = letters(engine)
    assert [(f["kind"], f["part"], f["row_id"]) for f in found] == [
        (SKIP_KIND, 0, 7), (SKIP_KIND, 0, 333), (SKIP_KIND, 0, 334), (SKIP_KIND, 1, 999)]
    assert all(f["job"] == "cm_data" and "has a bad payload" in f["reason"]
               and f["reason"].startswith("BadRow") for f in found)
    assert [(w.status, w.rows_done) for w in work_rows(engine)] == [(S.DONE, 497),
                                                                     (S.DONE, 499)]
    # The quarantined rows still match the filter, yet the closing read does not reopen the
    # partitions, and a duplicate delivery processes nothing.
    activate(sessions, job)  # the round is due now
    result = reconcile_job(sessions, redis_client, job, lambda _j, _p: None, interval=1,
                           grace=0, settle=0)
    assert result.closing_s is not None and (result.late, result.reopened) == (0, 0)
    assert run_all(job, sessions, leases, redis_client) == []
    assert processed(engine) == counts


def test_a_new_run_leaves_quarantined_rows_out_until_their_letter_is_purged(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 500)
    job = skipping({42}, limit=1)
    assert run_all(job, sessions, leases, redis_client) == [Outcome.DONE]
    # A fresh partition run of the same job, its row reset to the start: 42 is still left out.
    with sessions.begin() as session:
        session.execute(WORK.update().values(status=S.PENDING, next_id=1))
    runner = PartitionRunner(job, 0, sessions=sessions, leases=leases, lease_ttl=10.0,
                             owner="test", shutdown=threading.Event())
    assert runner.run() == Outcome.DONE and runner.rows_done == 0
    assert processed(engine)[42] == 0 and len(letters(engine)) == 1


def test_past_the_skip_limit_the_partition_fails(
        engine: Engine, sessions: sessionmaker[Session], leases: Leases,
        redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 1000)
    # Partition 0 meets 7, then 150 and 250 (batches 1, 2, 3): the third is past the limit.
    # Partition 1 meets one bad row and finishes.
    job = skipping({7, 150, 250, 600}, limit=2)
    assert run_all(job, sessions, leases, redis_client) == [Outcome.FAILED, Outcome.DONE]
    failed, done = work_rows(engine)
    assert failed.status == S.FAILED and "skip_limit=2" in failed.error
    assert "SkipLimitExceeded" in failed.error and "row 250" in failed.error
    assert done.status == S.DONE and done.rows_done == 499
    # The failing batch (201..300) rolled back whole, its letter too; the batches before it
    # committed with their quarantined rows.
    counts = processed(engine)
    assert {i for i in range(1, 201) if counts[i] != 1} == {7, 150}
    assert all(counts[i] == 0 for i in range(201, 301))
    assert [f["row_id"] for f in letters(engine)] == [7, 150, 600]


def test_a_batch_of_only_bad_rows_moves_on(engine: Engine, sessions: sessionmaker[Session],
                                          leases: Leases, redis_client: redis.Redis) -> None:
    seed_cm_data(engine, 300)
    bad = set(range(101, 201))
    job = skipping(bad, limit=100, partition_size=300)
    assert run_all(job, sessions, leases, redis_client) == [Outcome.DONE]
    counts = processed(engine)
    assert {i for i, n in counts.items() if n != 1} == bad
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(DEAD_LETTERS)).scalar() == 100


@pytest.mark.parametrize(("changes", "field"), [
    ({"skip_on": (BadRow, "not an exception")}, "skip_on"),
    ({"skip_on": [BadRow]}, "skip_on"),
    ({"skip_on": (BaseException,)}, "skip_on"),
    ({"skip_on": (BadRow,), "skip_limit": -1}, "skip_limit"),
    ({"skip_on": (BadRow,), "skip_limit": 1.5}, "skip_limit"),
    ({"skip_limit": 3}, "skip_on"),
])
def test_bad_skip_declarations_are_refused_naming_the_field(changes: dict[str, Any],
                                                            field: str) -> None:
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(cm_data, **changes)
