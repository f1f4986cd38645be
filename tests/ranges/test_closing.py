"""A run ends on a closing round, whatever the id allocation (tasks/ranges/closing.py).

In-process on a real Redis and all three databases: ids allocated before their transaction
(application-assigned, a PostgreSQL sequence with a cache) committed below a finished
partition's checkpoint, deleted tail ids and empty partitions, `succeeded` as a terminal
state, and a `follow` job that keeps taking rows that come to match.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from sqlalchemy import Engine, delete, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from lease import Leases
from tasks.ranges.closing import close_run
from tasks.ranges.controls import Controls
from tasks.ranges.jobs import RangeJob
from tasks.ranges.reconciler import reconcile_job
from tasks.ranges.runner import Outcome
from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS, SCHEDULES, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tests.ranges.test_guarantees import add_row
from tests.ranges.test_runner import counts, runner, small, work


def controls(sessions: sessionmaker[Session], client: redis.Redis) -> Controls:
    return Controls(sessions, client, lambda _job: {})


def start(sessions: sessionmaker[Session], client: redis.Redis) -> int:
    return int(controls(sessions, client).start("cm_data", "test")["run"])


def round_now(sessions: sessionmaker[Session], client: redis.Redis, job: RangeJob,
              settle: float = 60.0) -> Any:
    """One reconcile round, due now, that sends nothing anywhere."""
    with sessions.begin() as session:
        session.execute(update(SCHEDULES).values(next_run_at=SCHEDULES.c.updated_at))
        session.execute(update(WORK).values(dispatched_at=None))
    return reconcile_job(sessions, client, job, lambda _j, _p: None, interval=60, grace=0,
                         settle=settle)


def run_state(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(select(RANGE_RUNS.c.state)
                                .order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar_one())


def run_open(job: RangeJob, sessions: sessionmaker[Session], leases: Leases,
             engine: Engine) -> list[int]:
    """Run every open partition to its end; the partitions run."""
    with engine.connect() as conn:
        parts = [r.part for r in conn.execute(select(WORK.c.part).where(
            WORK.c.status.in_(S.OPEN)).order_by(WORK.c.part))]
    for part in parts:
        assert runner(job, part, sessions, leases).run() in (Outcome.DONE, Outcome.EMPTY)
    return parts


def test_a_row_with_an_early_id_committed_below_a_finished_checkpoint_is_processed(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """Item 1 with application-assigned ids: id 2 commits after partition 0 is done (its
    keyset pass over), while the run goes on; the run's closing round finds it."""
    seed_cm_data(engine, 2490, start_id=11)  # ids 11..2500; 1..10 free
    job = small()
    start(sessions, redis_client)
    assert round_now(sessions, redis_client, job).planned == 3
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    add_row(engine, 2)  # a short transaction, long after partition 0 finished
    assert [runner(job, p, sessions, leases).run() for p in (1, 2)] == [Outcome.DONE] * 2
    found = round_now(sessions, redis_client, job)  # the closing round
    assert (found.late, found.reopened, found.run) == (1, 1, None)
    assert work(engine, 0).status == S.PENDING and run_state(engine) == RunState.RUNNING
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    ended = round_now(sessions, redis_client, job)
    assert (ended.late, ended.run) == (0, RunState.SUCCEEDED)
    assert counts(engine) == {1: 2491}


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
def test_an_id_from_a_cached_sequence_committed_after_the_partition_finished_is_processed(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """Item 1 as reported: `CACHE 20` and two pooled connections. Connection A takes id 1
    and keeps 2..20 cached; B's ids start at 21. After the partition finished, A inserts id
    2 in a 2 ms transaction: far below the checkpoint."""
    with engine.begin() as conn:
        conn.execute(text("ALTER SEQUENCE cm_data_id_seq RESTART WITH 1 CACHE 20"))
    insert_row = text("INSERT INTO cm_data (status, payload, processed_count, "
                      "processed_fence) VALUES (0, 'seq', 0, 0) RETURNING id")
    with engine.connect() as a, engine.connect() as b:
        assert a.execute(insert_row).scalar() == 1
        a.commit()
        assert [b.execute(insert_row).scalar() for _ in range(30)][0] == 21
        b.commit()
        job = small()
        start(sessions, redis_client)
        round_now(sessions, redis_client, job)
        assert runner(job, 0, sessions, leases).run() == Outcome.DONE
        done = work(engine, 0)
        assert done.next_id == done.hi + 1 == 1001  # the keyset pass walked all of 1..1000
        assert a.execute(insert_row).scalar() == 2
        a.commit()
    assert round_now(sessions, redis_client, job).reopened == 1
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert round_now(sessions, redis_client, job).run == RunState.SUCCEEDED
    assert counts(engine) == {1: 32}


@pytest.mark.parametrize("gaps", ["deleted-tail", "empty-partitions"])
def test_a_run_over_deleted_and_missing_ids_ends_with_each_partition_claimed_once(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    gaps: str
) -> None:
    """Item 2: partition 0's highest ids (96..100) do not exist; with "empty-partitions" two
    whole partitions have no row. The run succeeds, and nothing is claimed twice."""
    seed_cm_data(engine, 95)
    seed_cm_data(engine, 100, start_id=101)
    if gaps == "empty-partitions":
        seed_cm_data(engine, 50, start_id=401)
    total = 195 if gaps == "deleted-tail" else 245
    job = small(partition_size=100, batch_size=30)
    start(sessions, redis_client)
    for _ in range(5):
        if round_now(sessions, redis_client, job).run == RunState.SUCCEEDED:
            break
        run_open(job, sessions, leases, engine)
    assert run_state(engine) == RunState.SUCCEEDED
    with engine.connect() as conn:
        claims = [r.claims for r in conn.execute(select(WORK.c.claims).order_by(WORK.c.part))]
    assert claims == [1] * len(claims) and len(claims) == (2 if gaps == "deleted-tail" else 5)
    assert counts(engine) == {1: total}
    # Ended: later rounds do nothing at all (no reopen, no rescans).
    later = round_now(sessions, redis_client, job, settle=0)
    assert (later.ran, later.held, later.closing_s) == (False, RunState.SUCCEEDED, None)


def test_succeeded_is_terminal_and_the_next_run_takes_the_rows_that_came_later(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)
    job = small()
    first = start(sessions, redis_client)
    round_now(sessions, redis_client, job)
    run_open(job, sessions, leases, engine)
    assert round_now(sessions, redis_client, job).run == RunState.SUCCEEDED
    with engine.connect() as conn:
        detail = conn.execute(select(RANGE_RUN_EVENTS.c.detail).where(
            RANGE_RUN_EVENTS.c.verb == "succeeded")).scalar_one()
        active = conn.execute(select(SCHEDULES.c.active)).scalar_one()
    assert detail.startswith("closing round began ") and "found nothing" in detail
    assert not active  # the job is no longer reconciled
    with engine.begin() as conn:  # a row that comes to match after the run: the next run's
        conn.execute(delete(CM_DATA).where(CM_DATA.c.id == 150))
    add_row(engine, 150)
    seed_cm_data(engine, 10)
    assert round_now(sessions, redis_client, job).held == RunState.SUCCEEDED
    assert counts(engine) == {1: 299, 0: 11}
    second = start(sessions, redis_client)
    assert second != first
    round_now(sessions, redis_client, job)
    run_open(job, sessions, leases, engine)
    assert round_now(sessions, redis_client, job).run == RunState.SUCCEEDED
    assert counts(engine) == {1: 310}


def test_a_follow_job_keeps_following_and_processes_rows_that_come_to_match(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)
    job = small(follow=True)
    start(sessions, redis_client)
    round_now(sessions, redis_client, job)
    run_open(job, sessions, leases, engine)
    assert round_now(sessions, redis_client, job).run == RunState.FOLLOWING
    add_row(engine, 1500)  # a new partition
    add_row(engine, 400)  # below partition 0's checkpoint
    planned = round_now(sessions, redis_client, job, settle=3600)
    assert planned.planned == 1 and planned.closing_s is None  # not due: settle
    run_open(job, sessions, leases, engine)
    found = round_now(sessions, redis_client, job, settle=0)
    assert (found.late, found.reopened) == (1, 1)
    run_open(job, sessions, leases, engine)
    assert round_now(sessions, redis_client, job, settle=0).late == 0
    assert run_state(engine) == RunState.FOLLOWING and counts(engine) == {1: 302}
    assert controls(sessions, redis_client).cancel("cm_data", "test")["state"] == "cancelled"


def test_a_closing_round_that_sees_a_partition_change_does_not_end_the_run(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """Between the closing round's start and its commit a partition was claimed again (its
    fence moved): the round proves nothing, so the run goes on."""
    seed_cm_data(engine, 300)
    job = small()
    start(sessions, redis_client)
    round_now(sessions, redis_client, job)
    run_open(job, sessions, leases, engine)

    def hold_while_someone_claims(session: Session) -> bool:
        session.execute(update(WORK).values(fence=WORK.c.fence + 1))
        return True

    closing = close_run(sessions, job, hold_while_someone_claims, settle=0)
    assert closing.seconds is not None and closing.found == 0 and closing.run is None
    assert run_state(engine) == RunState.RUNNING
    assert round_now(sessions, redis_client, job).run == RunState.SUCCEEDED
