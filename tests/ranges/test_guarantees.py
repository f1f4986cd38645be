"""Issue 9, in-process: rows committed out of id order, fixed partition boundaries, the round's
term compare-and-set, poison partitions, a Redis that is away, and the demo job's knobs.

Real Redis and all three databases; seams in the runner and the reconciler stop a run or a
round at the exact moment the race needs.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, Row, create_engine, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import load_config, mark_processed
from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from lease import Leases
from tasks.config.settings import SettingsError
from tasks.deadletters.store import DeadLetters
from tasks.ranges import closing
from tasks.ranges.jobs import Context, RangeJob
from tasks.ranges.reconciler import activate, reconcile_job
from tasks.ranges.runner import DEAD_LETTER_KIND, Outcome
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tests.ranges.test_runner import counts, plan, runner, small, work


def add_row(engine: Engine, row_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(insert(CM_DATA).values(id=row_id, status=0, payload=f"row-{row_id}",
                                            processed_count=0, processed_fence=0))


def parts(engine: Engine) -> list[tuple[int, int, int]]:
    with engine.connect() as conn:
        return [(r.part, r.lo, r.hi) for r in conn.execute(
            select(WORK.c.part, WORK.c.lo, WORK.c.hi).order_by(WORK.c.part))]


def round_now(sessions: sessionmaker[Session], client: redis.Redis, job: RangeJob,
              **kwargs: Any) -> Any:
    """One reconcile round, due now, that dispatches nothing anywhere."""
    with sessions.begin() as session:  # let partitions be dispatched again at once
        session.execute(update(WORK).values(dispatched_at=None))
    activate(sessions, job)
    options: dict[str, Any] = {"interval": 60, "grace": 0}
    options.update(kwargs)
    return reconcile_job(sessions, client, job, lambda _j, _p: None, **options)


# Item 2: a growing table loses rows.

def test_the_closing_read_split_in_two_finds_rows_on_each_side_and_beyond_every_partition(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """A job of four partitions reads its closing read in two halves at once, split at the
    second partition's upper bound: a row that came to match in the first partition and one in
    the last are found, and the two partitions holding them
    go back to pending; a row above every partition is found too (a round plans it)."""
    seed_cm_data(engine, 40)
    job = small(partition_size=10, batch_size=5)
    plan(sessions, redis_client, job)
    bounds = parts(engine)
    assert len(bounds) == 4
    for part, _lo, _hi in bounds:
        assert runner(job, part, sessions, leases).run() == Outcome.DONE
    cut = closing._cut(sessions, [(p, lo, hi, None) for p, lo, hi in bounds])
    assert cut == bounds[1][2]
    with engine.begin() as conn:  # rows 2 and 39 come to match again, below their checkpoints
        conn.execute(update(CM_DATA).where(CM_DATA.c.id.in_([2, 39])).values(status=0))
    assert round_now(sessions, redis_client, job, settle=0).reopened == 2
    assert [(w.part, w.status) for w in map(lambda b: work(engine, b[0]), bounds)] == [
        (0, S.PENDING), (1, S.DONE), (2, S.DONE), (3, S.PENDING)]
    above = bounds[-1][2] + 5
    add_row(engine, above)
    assert sorted(closing.closing_read(sessions, job, None, cut)) == [2, 39, above]
    assert sorted(closing.closing_read(sessions, job, None, None)) == [2, 39, above]


def test_a_closing_read_on_sqlite_in_memory_is_not_split() -> None:
    """Every connection of an in-memory SQLite database is a database of its own, so the
    closing read there stays one statement on one connection."""
    memory = sessionmaker(create_engine("sqlite://"))
    file_backed = sessionmaker(create_engine("sqlite:////tmp/never-opened.sqlite"))
    four = [(p, p * 10, p * 10 + 9, None) for p in range(4)]
    assert closing._cut(memory, four) is None
    assert closing._cut(file_backed, four) == 19
    assert closing._cut(file_backed, four[:1]) is None



def test_rows_committed_after_the_keyset_pass_are_processed_by_the_closing_round(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """The issue's gap: after the keyset pass finished the partition, a row is committed at
    the end of the partition (row 31) and one below the checkpoint (an id taken early,
    committed late). The closing round finds both; the partition's second pass processes
    them, and the round after it finds nothing."""
    seed_cm_data(engine, 10)
    seed_cm_data(engine, 10, start_id=21)  # ids 1..10 and 21..30; 15 is free below the end
    job = small(batch_size=4)
    plan(sessions, redis_client, job)
    inserted: list[int] = []

    def commit_in_the_gap(step: str) -> None:
        if step == "keyset-done" and not inserted:
            add_row(engine, 31)  # the table grows inside the partition
            add_row(engine, 15)  # out of id order: below the keyset cursor (31)
            inserted.extend([31, 15])

    assert runner(job, 0, sessions, leases, seam=commit_in_the_gap).run() == Outcome.DONE
    assert inserted == [31, 15]
    assert counts(engine) == {1: 20, 0: 2}
    assert round_now(sessions, redis_client, job, settle=0).reopened == 1
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 22}
    row = work(engine, 0)
    assert row.rows_done == 22 and row.next_id == row.hi + 1
    # Nothing is left for a reopen to find, and a later round does not reopen it needlessly.
    assert round_now(sessions, redis_client, job, settle=0).reopened == 0


def test_a_job_reconciled_without_a_run_repeats_its_closing_read_every_settle_interval(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """A transaction open across the closing read commits a row below the checkpoint after
    the partition is done. A job activated without a run is followed (tasks.ranges.closing):
    its closing read finds the row once it is due (RANGE_SETTLE after the last one)."""
    seed_cm_data(engine, 500)
    seed_cm_data(engine, 100, start_id=600)
    job = small()
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    first = round_now(sessions, redis_client, job, settle=3600)  # never read: due at once
    assert first.closing_s is not None and first.late == 0
    add_row(engine, 550)  # committed after the closing read, below the checkpoint (700)
    early = round_now(sessions, redis_client, job, settle=3600)
    assert (early.closing_s, early.late, early.reopened) == (None, 0, 0)  # not due yet
    late = round_now(sessions, redis_client, job, settle=0)
    assert (late.late, late.reopened) == (1, 1)
    assert work(engine, 0).status == S.PENDING
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 601}
    clean = round_now(sessions, redis_client, job, settle=0)
    assert (clean.late, clean.reopened) == (0, 0)


def test_a_process_that_leaves_rows_matching_the_filter_fails_and_writes_nothing(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)

    def count_only(rows: Sequence[Row[Any]], ctx: Context) -> None:
        ctx.session.execute(update(CM_DATA).where(CM_DATA.c.id.in_([r.id for r in rows]))
                            .values(processed_count=CM_DATA.c.processed_count + 1))

    job = small(process=count_only)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.FAILED
    failed = work(engine, 0)
    assert "FilterNotCleared" in failed.error and "still matches the job's filter" in failed.error
    assert counts(engine) == {0: 300}
    with pytest.raises(ValueError, match="`where`"):
        RangeJob(name="no_filter", table=CM_DATA, process=mark_processed,
                 where=None)  # type: ignore[arg-type]


# Item 3: a plan is data.

def test_a_changed_partition_size_never_recuts_stored_partitions(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 100)
    big = small(partition_size=100, batch_size=30)
    assert plan(sessions, redis_client, big) == [0]
    halved = dataclasses.replace(big, partition_size=50)
    assert round_now(sessions, redis_client, halved).planned == 0
    assert parts(engine) == [(0, 1, 100)]  # the (1: 51..100) is not planned
    seed_cm_data(engine, 100)  # ids 101..200: planned after the last stored hi, size 50
    assert round_now(sessions, redis_client, halved).planned == 2
    assert parts(engine) == [(0, 1, 100), (1, 101, 150), (2, 151, 200)]
    for part in (0, 1, 2):
        assert runner(halved, part, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 200}


# Item 5: one round at a time, by the term.

def test_an_overtaken_round_neither_plans_nor_dispatches(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 3000)
    job = small()
    activate(sessions, job)
    read, resume = threading.Event(), threading.Event()
    sent_a: list[int] = []
    outcome: list[Any] = []

    def pause_after_read(step: str) -> None:
        if step == "read":
            read.set()
            assert resume.wait(30)

    def round_a() -> None:
        try:
            outcome.append(reconcile_job(sessions, redis_client, job,
                                         lambda _j, p: sent_a.append(p), interval=60, grace=0,
                                         seam=pause_after_read))
        except Exception as exc:  # noqa: BLE001 - the old code raised IntegrityError here
            outcome.append(exc)

    thread = threading.Thread(target=round_a)
    thread.start()
    assert read.wait(30)
    # While A sits between its reads and its writes, `start` makes the job due again and
    # round B runs to the end.
    activate(sessions, job)
    sent_b: list[int] = []
    b = reconcile_job(sessions, redis_client, job, lambda _j, p: sent_b.append(p), interval=60,
                      grace=0)
    resume.set()
    thread.join(30)
    a = outcome[0]
    assert not isinstance(a, Exception), a
    assert (b.planned, sorted(sent_b)) == (3, [0, 1, 2])
    assert (a.overtaken, a.planned, sent_a) == (True, 0, [])
    assert parts(engine) == [(0, 1, 1000), (1, 1001, 2000), (2, 2001, 3000)]


# Item 4: poison partitions.

def crash(job: RangeJob, part: int, sessions: sessionmaker[Session], leases: Leases,
          client: redis.Redis) -> None:
    """A holder that claims the partition and dies: its lease lapses, the row stays running."""
    held = leases.acquire(job.lease_name(part), ttl=5.0, fence_floor=work_fence(sessions, part))
    assert runner(job, part, sessions, leases).row.claim(held.fence) is not None
    client.delete(*client.keys("lease:*"))  # the holder is gone; its lease lapsed


def work_fence(sessions: sessionmaker[Session], part: int) -> int:
    with sessions() as session:
        return int(session.execute(select(WORK.c.fence).where(WORK.c.part == part)).scalar_one())


def test_a_partition_whose_holders_keep_dying_is_failed_and_dead_lettered(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)
    job = small()
    plan(sessions, redis_client, job)
    for _ in range(2):  # two attempts die: the first claim, then a takeover
        crash(job, 0, sessions, leases, redis_client)
    assert work(engine, 0).crashes == 1
    assert runner(job, 0, sessions, leases, crash_cap=2).run() == Outcome.FAILED
    failed = work(engine, 0)
    assert failed.status == S.FAILED and "REDELIVERY_CAP=2" in failed.error
    [letter] = DeadLetters(sessions).list(DEAD_LETTER_KIND)
    assert letter.ref == f"{job.name}:0" and letter.payload["crashes"] == 2
    assert counts(engine) == {0: 300}
    # Resuming the job gives it a fresh count; a batch that commits resets it too.
    assert activate(sessions, job) == 1
    assert work(engine, 0).crashes == 0
    crash(job, 0, sessions, leases, redis_client)
    assert runner(job, 0, sessions, leases, crash_cap=2).run() == Outcome.DONE
    assert work(engine, 0).crashes == 0
    assert counts(engine) == {1: 300}


def test_holders_that_stop_cleanly_or_progress_are_not_counted_as_crashes(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)
    job = small()
    plan(sessions, redis_client, job)
    stop = threading.Event()
    stop.set()
    for _ in range(4):  # four warm shutdowns: handed over, never a crash
        assert runner(job, 0, sessions, leases, shutdown=stop).run() == Outcome.HANDED_OVER
    assert work(engine, 0).crashes == 0
    assert runner(job, 0, sessions, leases, crash_cap=1).run() == Outcome.DONE


# Item 7: Redis away.

def test_a_progress_update_that_finds_redis_away_does_not_fail_the_partition(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 300)
    job = small()
    plan(sessions, redis_client, job)

    def backend_away(_progress: Any) -> None:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6399. Connection refused.")

    outcome = runner(job, 0, sessions, leases, on_progress=backend_away).run()
    assert outcome == Outcome.REDIS_UNAVAILABLE
    row = work(engine, 0)
    assert (row.status, row.error, row.crashes) == (S.PENDING, None, 0)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 300}


@pytest.mark.parametrize("db_kind", ["sqlite"], indirect=True)
def test_a_partition_finds_redis_away_when_it_starts(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 10)
    job = small()
    plan(sessions, redis_client, job)
    away = Leases(redis.Redis(port=1, socket_connect_timeout=0.2))
    assert runner(job, 0, sessions, away).run() == Outcome.REDIS_UNAVAILABLE
    away.close()
    assert work(engine, 0).status == S.PENDING


# Item 3: the demo job's knobs are read once, with a clear error.

@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CM_DATA_BATCH_SIZE": "1k"}, "CM_DATA_BATCH_SIZE='1k' is not a number"),
        ({"CM_DATA_PARTITION_SIZE": "0"}, "CM_DATA_PARTITION_SIZE='0' must be at least 1"),
        ({"CM_DATA_PARALLELISM": "-2"}, "CM_DATA_PARALLELISM='-2' must be at least 1"),
        ({"CM_DATA_BATCH_DELAY": "-1"}, "CM_DATA_BATCH_DELAY='-1' must be at least 0"),
        ({"CM_DATA_WORK": "gpu"}, "CM_DATA_WORK='gpu' must be one of trivial, cpu"),
    ],
)
def test_bad_demo_knobs_are_refused_with_the_variable_named(env: dict[str, str],
                                                           message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_config(env)
    assert str(raised.value) == message


@pytest.mark.parametrize("db_kind", ["sqlite"], indirect=True)
def test_demo_knobs_are_read_once_not_per_batch(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed_cm_data(engine, 300)
    job = small()
    plan(sessions, redis_client, job)
    monkeypatch.setenv("CM_DATA_BATCH_DELAY", "5")  # after import: must change nothing
    monkeypatch.setenv("CM_DATA_WORK", "nonsense")
    started = time.monotonic()
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert time.monotonic() - started < 4  # three batches, none of them slept 5 s
    assert counts(engine) == {1: 300}
