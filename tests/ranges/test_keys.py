"""Range jobs over any ordered unique key (issue 21): UUID and composite keys walked by keyset,
partitions cut by row count, the closing round, and bad keys refused before anything is
written. In-process on the three databases; on real workers in test_keys_workers.py."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import (
    JSON,
    Column,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session, sessionmaker

from bench.keyed import BASE, JOBS, KEYED, create, job_for, mark, seed
from lease import Leases
from tasks.ranges.controls import ControlRefused, Controls
from tasks.ranges.dryrun import dry_run
from tasks.ranges.jobs import RangeJob, register
from tasks.ranges.reconciler import activate, due_now, reconcile_job
from tasks.ranges.runner import Outcome
from tasks.ranges.tables import RANGE_RUNS, SCHEDULES, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tests.ranges.inprocess import run_all
from tests.ranges.test_runner import runner

pytestmark = pytest.mark.timeout(120)


def small(key: str, **changes: Any) -> RangeJob:
    return dataclasses.replace(JOBS[key], **{"partition_size": 400, "batch_size": 64,
                                             **changes})


def histogram(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(c): int(n) for c, n in conn.execute(
            select(KEYED.c.processed_count, func.count()).group_by(KEYED.c.processed_count))}


def parts(engine: Engine, job: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(WORK).where(WORK.c.job == job)
                                 .order_by(WORK.c.part)).all())


def a_round(sessions: sessionmaker[Session], client: redis.Redis, job: RangeJob) -> Any:
    """One reconcile round of `job` now."""
    due_now(sessions, job.name)
    return reconcile_job(sessions, client, job, lambda _j, _p: None, interval=1, grace=0)


@pytest.mark.parametrize("key", ["uuid", "composite"])
def test_a_keyed_job_processes_every_row_once_and_its_closing_round_finds_late_rows(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    key: str,
) -> None:
    """2,000 rows in about 5 partitions of 400 rows: every row once; then rows inserted with
    keys below the finished partitions' cursors (anywhere in the key space) are found by the
    closing round, their partitions reopened from `lo_key`, and processed once."""
    create(engine)
    seed(engine, 2000)
    job = small(key)
    Controls(sessions, redis_client, lambda _job: {}).start(job.name, "test")
    outcomes = run_all(job, sessions, leases, redis_client)
    assert outcomes and set(outcomes) == {S.DONE}, outcomes
    assert histogram(engine) == {1: 2000}
    planned = parts(engine, job.name)
    assert planned[0].lo_key is None and planned[-1].hi_key is None
    assert all(p.hi_key is not None for p in planned[:-1])
    sizes = [p.rows_done for p in planned]
    assert max(sizes) <= 1.2 * min(sizes), sizes
    seed(engine, 50, seed_value=99, first_id=10_001, stride=40)  # keys all over the space
    closing = a_round(sessions, redis_client, job)
    assert closing.late == 50 and closing.reopened >= 2, closing
    reopened = [p for p in parts(engine, job.name) if p.status == S.PENDING]
    assert all(p.next_key == p.lo_key and p.next_id == p.lo for p in reopened)
    for p in reopened:
        assert runner(job, p.part, sessions, leases).run() == S.DONE
    assert histogram(engine) == {1: 2050}
    ended = a_round(sessions, redis_client, job)
    assert ended.late == 0 and ended.run == RunState.SUCCEEDED


def test_a_keyed_run_resumes_from_its_stored_cursor(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
) -> None:
    """A holder stopped after its time slice; the next one starts at the stored cursor (the
    JSON of the last key read), so no row is read twice."""
    create(engine)
    seed(engine, 600)
    job = small("composite", partition_size=10_000, batch_size=100)
    activate(sessions, job)
    a_round(sessions, redis_client, job)
    ticks = iter(range(0, 1000, 1))
    first = runner(job, 0, sessions, leases, time_slice=2.5, clock=lambda: next(ticks))
    assert first.run() == Outcome.HANDED_OVER
    [row] = parts(engine, job.name)
    assert row.status == S.PENDING and row.next_key is not None and row.rows_done > 0
    done_before = row.rows_done
    assert runner(job, 0, sessions, leases).run() == S.DONE
    assert histogram(engine) == {1: 600}
    assert parts(engine, job.name)[0].rows_done == 600 and done_before < 600


@pytest.mark.parametrize("key", ["int-rows", "composite"])
def test_partitions_cut_by_rows_hold_equal_row_counts_on_a_skewed_key_space(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    key: str,
) -> None:
    """Half the rows on ids 1..1000, the other half spread over ids up to 10^9 (and their
    timestamps likewise): id-span partitions would hold 1,000 rows in the first and a handful
    in each of the rest; cut by rows, every partition holds within 20% of the mean."""
    create(engine)
    seed(engine, 1000)
    with engine.begin() as conn:  # the rest, sparse and far apart
        conn.execute(insert(KEYED), [
            {"id": 2000 + i * 997_001, "uid": uuid.UUID(int=i + 1), "status": 0,
             "created_at": BASE + timedelta(days=1 + i * 37),
             "payload": "", "processed_count": 0, "processed_fence": 0} for i in range(1000)])
    job = (small("int", partition_by="rows", partition_size=300) if key == "int-rows"
           else small("composite", partition_size=300))
    activate(sessions, job)
    a_round(sessions, redis_client, job)
    planned = parts(engine, job.name)
    counts = [_rows_in(job, p, engine) for p in planned]
    assert len(planned) == 7 and sum(counts) == 2000, counts
    mean = 2000 / len(planned)
    assert all(abs(c - mean) <= 0.2 * mean for c in counts), counts
    for p in planned:  # and the plan runs: every row once
        assert runner(job, p.part, sessions, leases).run() == S.DONE
    assert histogram(engine) == {1: 2000}
    assert [p.rows_done for p in parts(engine, job.name)] == counts


def _rows_in(job: RangeJob, p: Any, engine: Engine) -> int:
    """The rows within the partition's bounds (counted by the database, in its ordering)."""
    key = job.keyset
    lo = key.decode(p.lo_key) if job.keyed else (p.lo - 1,)
    hi = key.decode(p.hi_key) if job.keyed else (p.hi,)
    with engine.connect() as conn:
        dialect = conn.dialect.name
        cond = [key.above(dialect, key.literal(lo))] if lo is not None else []
        if hi is not None:
            cond.append(key.at_most(dialect, key.literal(hi)))
        return int(conn.execute(select(func.count()).select_from(KEYED).where(*cond))
                   .scalar_one())


def _json_table() -> Table:
    return Table("keyed_json", MetaData(), Column("id", Integer, primary_key=True),
                 Column("doc", JSON, nullable=False, unique=True),
                 Column("score", Float, nullable=False, unique=True),
                 Column("tag", String(20), unique=True),
                 Column("label", String(20), nullable=False),
                 Column("status", Integer, nullable=False))


@pytest.mark.parametrize(("changes", "message"), [
    ({"key": ("doc",)}, "key column 'doc' of table keyed_json is JSON, which cannot be a range "
                        "key (one of: integer, string, UUID, date or datetime)"),
    ({"key": ("score",)}, "key column 'score' of table keyed_json is FLOAT"),
    ({"id_column": "tag"}, "key column 'tag' of table keyed_json is nullable"),
    ({"key": ("label",)}, "key label of table keyed_json is not unique in its metadata"),
    ({"key": ("nope", "id")}, "table keyed_json has no column 'nope' (the key)"),
    ({"key": ("label", "id"), "partition_by": "ids"}, "is not one integer column, so its "
                                                      "partitions are cut by rows"),
    ({"key": ("label", "id"), "skip_on": (ValueError,)}, "a skip policy (skip_on) needs an "
                                                         "integer key"),
])
def test_a_key_that_cannot_be_walked_is_refused_when_declared(
    changes: dict[str, Any], message: str
) -> None:
    table = _json_table()
    with pytest.raises(ValueError, match=r"^range job bad_key: ") as refused:
        RangeJob(name="bad_key", table=table, where=table.c.status == 0, process=mark,
                 **changes)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_uuid_id_column_is_accepted_and_cut_by_rows() -> None:
    job = job_for("by_uid", ("uid",))
    assert job.keyed and job.by_rows and job.keyset.names == ("uid",)
    same = RangeJob(name="by_uid2", table=KEYED, where=KEYED.c.status == 0, process=mark,
                    id_column="uid", columns=("uid", "id"))
    assert same.keyset.names == ("uid",) and same.by_rows


# Jobs whose tables in the database are not what their metadata says (made by the tests).
GHOST = Table("keyed_ghost", MetaData(), Column("id", Integer, primary_key=True),
              Column("code", String(36), nullable=False, unique=True),
              Column("status", Integer, nullable=False))
GHOST_JOB = register(RangeJob(name="keyed_ghost", table=GHOST, where=GHOST.c.status == 0,
                              process=mark, key=("code",)))
DOC = Table("keyed_doc", MetaData(), Column("doc", String(200), primary_key=True),
            Column("status", Integer, nullable=False))
DOC_JOB = register(RangeJob(name="keyed_doc", table=DOC, where=DOC.c.status == 0,
                            process=mark, id_column="doc"))


def test_a_start_on_a_key_the_database_lacks_is_refused_and_leaves_no_run(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis,
) -> None:
    """The table in the job's metadata has a key column the database's table lacks (a
    migration not run): `start` says so in one line and writes nothing. The same job on a
    table whose column has no ordering (PostgreSQL's json declared as a string) likewise."""
    job = GHOST_JOB
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS keyed_ghost"))
        conn.execute(text("CREATE TABLE keyed_ghost (id INTEGER PRIMARY KEY, "
                          "status INTEGER NOT NULL)"))
    try:
        with pytest.raises(ControlRefused) as refused:
            Controls(sessions, redis_client, lambda _job: {}).start(job.name, "test")
        assert str(refused.value).startswith("start keyed_ghost: cannot read the keys of table "
                                             "keyed_ghost: ")
        assert "\n" not in str(refused.value)
        with engine.connect() as conn:
            assert conn.execute(select(RANGE_RUNS.c.id)).first() is None
            assert conn.execute(select(SCHEDULES.c.name)).first() is None
            assert conn.execute(select(WORK.c.id)).first() is None
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE keyed_ghost"))


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
def test_a_column_the_database_cannot_order_is_refused_at_start(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis,
) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS keyed_doc"))
        conn.execute(text("CREATE TABLE keyed_doc (doc json NOT NULL, status int NOT NULL)"))
    job = DOC_JOB
    try:
        with pytest.raises(ControlRefused, match="could not identify an ordering operator"):
            Controls(sessions, redis_client, lambda _job: {}).start(job.name, "test")
        with engine.connect() as conn:
            assert conn.execute(select(RANGE_RUNS.c.id)).first() is None
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE keyed_doc"))


def test_a_keyed_run_succeeds_on_its_closing_round(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
) -> None:
    """Started through the controls like an operator's `jobs start`: planned, run, and the
    closing round that finds nothing ends the run `succeeded`."""
    create(engine)
    seed(engine, 500)
    job = small("uuid", partition_size=200)
    Controls(sessions, redis_client, lambda _job: {}).start(job.name, "test")
    outcomes = run_all(job, sessions, leases, redis_client)
    assert set(outcomes) == {S.DONE} and histogram(engine) == {1: 500}
    assert a_round(sessions, redis_client, job).run == RunState.SUCCEEDED


def _leave_matching(rows: Any, ctx: Any) -> None:
    """A process function that breaks the contract: its rows still match `where`."""


def test_a_keyed_job_that_leaves_its_rows_matching_fails_its_partition_writing_nothing(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
) -> None:
    """The filter contract's check looks the batch's keys up as tuples (`(a, b) IN (...)`)."""
    create(engine)
    seed(engine, 100)
    job = small("composite", process=_leave_matching)
    assert run_all(job, sessions, leases, redis_client) == [S.FAILED]
    [row] = parts(engine, job.name)
    assert "FilterNotCleared" in row.error and "still matches the job's filter" in row.error
    assert row.rows_done == 0 and row.next_key is None


@pytest.mark.parametrize("key", ["uuid", "composite"])
@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"], indirect=True)
def test_a_keyed_dry_run_shows_the_plan_and_first_batch_and_writes_nothing(
    engine: Engine, sessions: sessionmaker[Session], key: str,
) -> None:
    create(engine)
    seed(engine, 1200)
    with engine.begin() as conn:
        conn.execute(update(KEYED).where(KEYED.c.id % 3 == 0).values(status=1))
    job = small(key)
    found = dry_run(sessions, job, None, None)
    assert found.partitions_total == 3 and found.estimated_rows == 800 and found.estimate_exact
    assert found.sample["rows"] == job.batch_size and "ORDER BY" in (found.sql or "")
    assert [p["part"] for p in found.partitions] == [0, 1, 2]
    with engine.connect() as conn:
        assert conn.execute(select(WORK.c.id)).first() is None
        assert conn.execute(select(RANGE_RUNS.c.id)).first() is None


NAMES = Table("keyed_names", MetaData(), Column("code", String(40), primary_key=True),
              Column("status", Integer, nullable=False),
              Column("processed_count", Integer, nullable=False))


def _mark_names(rows: Any, ctx: Any) -> None:
    ctx.session.execute(update(NAMES).where(ctx.in_batch(NAMES.c.code, [r.code for r in rows]))
                        .values(status=1, processed_count=NAMES.c.processed_count + 1))


NAMES_JOB = RangeJob(name="keyed_names", table=NAMES, where=NAMES.c.status == 0,
                     process=_mark_names, id_column="code", partition_size=150, batch_size=40)


def _names(n: int, salt: str) -> list[dict[str, Any]]:
    """Codes in mixed case, with accents and digits: the database's collation orders them
    (MariaDB's default ignores case), not Python."""
    stems = ["alpha", "Bravo", "charlie", "Delta", "écho", "Zulu", "zeta", "ÉCLAIR", "m", "M_"]
    return [{"code": f"{stems[i % len(stems)]}-{salt}{i:05d}", "status": 0,
             "processed_count": 0} for i in range(n)]


def test_a_string_key_is_walked_in_the_databases_collation_exactly_once(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
) -> None:
    NAMES.drop(engine, checkfirst=True)
    NAMES.create(engine)
    try:
        with engine.begin() as conn:
            conn.execute(insert(NAMES), _names(600, "a"))
        outcomes = run_all(NAMES_JOB, sessions, leases, redis_client)
        assert len(outcomes) == 4 and set(outcomes) == {S.DONE}

        def done() -> dict[int, int]:
            with engine.connect() as conn:
                return {int(c): int(n) for c, n in conn.execute(
                    select(NAMES.c.processed_count, func.count())
                    .group_by(NAMES.c.processed_count))}

        assert done() == {1: 600}
        with engine.begin() as conn:  # late rows all over the key space
            conn.execute(insert(NAMES), _names(30, "b"))
        closing = a_round(sessions, redis_client, NAMES_JOB)
        assert closing.late == 30 and closing.reopened >= 2, closing
        for p in parts(engine, NAMES_JOB.name):
            if p.status == S.PENDING:
                assert runner(NAMES_JOB, p.part, sessions, leases).run() == S.DONE
        assert done() == {1: 630}
        assert a_round(sessions, redis_client, NAMES_JOB).late == 0
    finally:
        NAMES.drop(engine)
