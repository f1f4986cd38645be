"""How a batch reads and closes, in-process on a real Redis and all three databases: rows off
the driver's cursor still look like SQLAlchemy rows to a job, a short batch ends the keyset
pass and finishes the partition in its transaction (rows committed late around it are the
run's closing round's), and the filter-contract check stays exact past its cheap range test."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from sqlalchemy import Connection, DateTime, Engine, Integer, Row, String, select, update
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from bench import cm_data as cm_data_module
from bench.cm_data import mark_processed
from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from lease import Leases
from tasks.ranges import batches
from tasks.ranges.batches import Batches
from tasks.ranges.jobs import Context
from tasks.ranges.reads import BatchRows, built, plain
from tasks.ranges.runner import Outcome
from tasks.ranges.tables import WORK
from tests.ranges.test_guarantees import add_row, round_now
from tests.ranges.test_runner import counts, plan, runner, small, work


def test_a_job_that_reads_its_rows_gets_the_rows_sqlalchemy_would_give(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    seed_cm_data(engine, 250)
    seen: list[tuple[Any, ...]] = []
    kinds: set[type] = set()

    def look(rows: Sequence[Row[Any]], ctx: Context) -> None:
        kinds.add(type(rows))
        assert [r.id for r in rows[1:3]] == [rows[1].id, rows[2].id]
        for row in rows:
            assert isinstance(row, Row)
            assert row._mapping[CM_DATA.c.id] == row.id == row[0]
            seen.append((row.id, row.payload, row._mapping["payload"]))
        mark_processed(rows, ctx)

    job = small(process=look)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert kinds == {BatchRows}
    with engine.connect() as conn:
        stored = conn.execute(select(CM_DATA.c.id, CM_DATA.c.payload).order_by(CM_DATA.c.id))
        assert seen == [(r.id, r.payload, r.payload) for r in stored]
    assert counts(engine) == {1: 250}


def test_a_job_writing_by_span_or_ids_never_makes_rows(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """cm_data writes by its span on SQLite and by its ids elsewhere, which it reads off the
    driver's tuples (`ids_of`): no `Row` is made for a job that never looks at one."""
    seed_cm_data(engine, 250)
    made: list[int] = []
    rows_of = BatchRows.rows

    def spy(self: BatchRows) -> Sequence[Row[Any]]:
        made.append(len(self))
        return rows_of(self)

    monkeypatch.setattr(BatchRows, "rows", spy)
    job = small()
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 250}
    assert made == []


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The `from_id` of every batch read, in order."""
    found: list[int] = []
    fetch = Batches._fetch

    def spy(self: Batches, conn: Connection, from_id: int, size: int) -> BatchRows:
        found.append(from_id)
        return fetch(self, conn, from_id, size)

    monkeypatch.setattr(Batches, "_fetch", spy)
    yield found


def test_a_short_batch_ends_the_keyset_pass_and_the_closing_round_finds_late_rows(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    reads: list[int]
) -> None:
    """Rows 1..10 and 21..23, batches of 4: the fourth batch (23) is short, so it finishes
    the partition and no read follows it. Right then a row commits below the checkpoint (15,
    an id taken early) and one above it (30): the closing round finds both and sends the
    partition back, its keyset pass starting again from `lo`."""
    seed_cm_data(engine, 10)
    seed_cm_data(engine, 3, start_id=21)
    job = small(batch_size=4)
    plan(sessions, redis_client, job)
    steps: list[str] = []

    def commit_late(step: str) -> None:
        steps.append(step)
        add_row(engine, 15)
        add_row(engine, 30)

    assert runner(job, 0, sessions, leases, seam=commit_late).run() == Outcome.DONE
    assert steps == ["keyset-done"]
    assert reads == [1, 5, 9, 23]
    row = work(engine, 0)
    assert (row.status, row.rows_done, row.next_id) == ("done", 13, row.hi + 1)
    assert counts(engine) == {1: 13, 0: 2}
    found = round_now(sessions, redis_client, job, settle=0)
    assert (found.late, found.reopened) == (2, 1)
    assert (work(engine, 0).status, work(engine, 0).next_id) == ("pending", row.lo)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert reads == [1, 5, 9, 23, 1]  # one short read from `lo` finds 15 and 30
    assert counts(engine) == {1: 15}
    assert work(engine, 0).rows_done == 15


def test_a_full_last_batch_still_ends_with_an_empty_keyset_read(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    reads: list[int]
) -> None:
    seed_cm_data(engine, 8)
    job = small(batch_size=4)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert reads == [1, 5, 9]
    assert counts(engine) == {1: 8}


def test_the_filter_check_finds_a_row_left_matching_past_its_first_chunk(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The range test sees a row still matching; the id lookup, 3 ids a statement, names it
    (row 8, in the third chunk), and the batch writes nothing."""
    monkeypatch.setattr(batches, "CHECK_CHUNK", 3)
    seed_cm_data(engine, 40)

    def all_but_eight(rows: Sequence[Row[Any]], ctx: Context) -> None:
        ids = [r.id for r in rows if r.id != 8]
        ctx.session.execute(update(CM_DATA).where(CM_DATA.c.id.in_(ids))
                            .values(status=1, processed_count=CM_DATA.c.processed_count + 1))

    job = small(process=all_but_eight, batch_size=10)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.FAILED
    failed = work(engine, 0)
    assert "row 8 still matches the job's filter" in failed.error
    assert counts(engine) == {0: 40}


def test_the_filter_check_is_not_fooled_by_a_quarantined_row_in_the_range(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """Row 5 of the first batch raises and is quarantined: it still matches the filter inside
    the batch's range, so the range test fails, and the id lookup (the batch's other rows)
    passes: the run finishes with every other row processed once."""

    class BadRow(ValueError):
        pass

    def picky(rows: Sequence[Row[Any]], ctx: Context) -> None:
        mark_processed(rows, ctx)
        if any(r.id == 5 for r in rows):
            raise BadRow("row 5")

    seed_cm_data(engine, 30)
    job = small(process=picky, batch_size=10, skip_on=(BadRow,), skip_limit=1)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 29, 0: 1}
    with engine.connect() as conn:
        assert conn.execute(select(WORK.c.status)).scalar() == "done"
        left = conn.execute(select(CM_DATA.c.id).where(CM_DATA.c.status == 0)).scalars().all()
    assert left == [5]


@pytest.mark.parametrize(("dialect", "column_type", "expected"), [
    (sqlite.dialect(), Integer(), True),
    (sqlite.dialect(), String(255), True),
    (sqlite.dialect(), DateTime(), False),  # stored as text, parsed by SQLAlchemy
    (postgresql.psycopg.dialect(), Integer(), True),
    (postgresql.psycopg.dialect(), String(255), True),
    (mysql.pymysql.dialect(), Integer(), True),
    (mysql.pymysql.dialect(), String(255), True),
])
def test_rows_come_off_the_cursor_only_when_no_column_needs_converting(
    dialect: Any, column_type: Any, expected: bool
) -> None:
    from sqlalchemy import Column

    assert plain([Column("x", column_type)], dialect) is expected


def test_a_job_must_read_its_id_column() -> None:
    with pytest.raises(ValueError, match="columns must include the id column 'id'"):
        small(columns=("payload",))


def test_cm_data_writes_a_batch_by_ids_in_chunks(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where it writes by ids (PostgreSQL, MariaDB), 3 ids a statement: every row once."""
    monkeypatch.setattr(cm_data_module, "IDS_CHUNK", 3)
    seed_cm_data(engine, 50)
    job = small(batch_size=10)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 50}


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
def test_a_span_write_touches_only_the_rows_its_read_returned(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """A row another transaction commits into a batch's id range between its read and its
    write (an id taken early) is not written by the batch's UPDATE by range: on PostgreSQL the
    batch reads and writes in one snapshot (REPEATABLE READ), so `ctx.span` is given and
    exact; on MariaDB, where an UPDATE reads the newest rows, no span is given and the batch
    writes by ids. Either way every row the batch wrote is one it read, and the late row is
    the closing round's, processed once."""
    seed_cm_data(engine, 10)
    seed_cm_data(engine, 9, start_id=12)  # 11 is missing: its id was taken, not committed
    seen: list[int] = []
    spans: list[tuple[int, int] | None] = []

    def late_insert(rows: Sequence[Row[Any]], ctx: Context) -> None:
        if not seen:
            add_row(engine, 11)  # commits on its own connection, inside the batch's range
        seen.extend(int(r.id) for r in rows)
        spans.append(ctx.span)
        mark_processed(rows, ctx)

    job = small(process=late_insert, batch_size=100)
    plan(sessions, redis_client, job)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert spans == ([(1, 20)] if engine.dialect.name == "postgresql" else [None])
    with engine.connect() as conn:
        written = {r.id for r in conn.execute(select(CM_DATA.c.id).where(CM_DATA.c.status == 1))}
    assert 11 not in seen and written == set(seen)
    found = round_now(sessions, redis_client, job, settle=0)
    assert (found.late, found.reopened) == (1, 1)
    assert runner(job, 0, sessions, leases).run() == Outcome.DONE
    assert counts(engine) == {1: 20}
    with engine.connect() as conn:
        assert conn.execute(select(CM_DATA.c.processed_count).where(CM_DATA.c.id == 11)) \
            .scalar_one() == 1


def test_the_partitions_of_a_job_share_its_statements_and_each_reads_only_its_own_rows(
    engine: Engine, sessions: sessionmaker[Session], leases: Leases, redis_client: redis.Redis
) -> None:
    """The reads and checks are built once per job and filter (`reads.built`) with the
    partition's bounds bound per call: three partitions run one after another in one
    process on the same statements, each processes exactly its own rows, and a filter
    made anew (a run's parameters) gets statements of its own."""
    seed_cm_data(engine, 2500)
    seen: dict[int, list[int]] = {}

    def note(rows: Sequence[Row[Any]], ctx: Context) -> None:
        seen.setdefault(ctx.partition.part, []).extend(r.id for r in rows)
        mark_processed(rows, ctx)

    job = small(process=note)
    plan(sessions, redis_client, job)
    shared = built(job, job.filter())
    for part in (2, 0, 1):
        assert runner(job, part, sessions, leases).run() == Outcome.DONE
        assert built(job, job.filter()) is shared
    with engine.connect() as conn:
        bounds = {p: (lo, hi) for p, lo, hi in conn.execute(
            select(WORK.c.part, WORK.c.lo, WORK.c.hi))}
    assert sorted(seen) == [0, 1, 2]
    for part, ids in seen.items():
        lo, hi = bounds[part]
        assert ids == [i for i in range(1, 2501) if lo <= i <= hi], part
    assert counts(engine) == {1: 2500}
    other = CM_DATA.c.status == 0  # the same filter, made anew: a clause of its own
    assert built(job, other) is not shared and built(job, other).where is other
