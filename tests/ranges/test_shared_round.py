"""One reconcile's rounds on one connection, reading what every job's round reads alike once
(`tasks.store.db.one_connection`, `tasks.ranges.reconciler.Shared`).

On all three databases: sessions of one connection commit their writes, roll back their
failures and refuse to nest; PostgreSQL and MariaDB check the connection out once for
all of them (SQLite keeps one per session); rounds of several jobs read a table's bounds
and the schedule rows once, and a row above the bounds they read is planned by the next
reconcile; a plan's rows inserted at once (COPY on PostgreSQL) as an INSERT stores them."""

from __future__ import annotations

import dataclasses

import pytest
import redis
from sqlalchemy import Engine, event, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from examples.seed import seed_cm_data
from tasks.ranges.reconciler import Shared, activate, reconcile_job
from tasks.ranges.tables import SCHEDULES, WORK
from tasks.store.db import NestedSession, insert_many, one_connection, pooled, utcnow
from tests.ranges.test_closing import start
from tests.ranges.test_guarantees import add_row
from tests.ranges.test_runner import small


def checkouts(engine: Engine) -> list[int]:
    """A list that grows by one at each connection checkout from the engine's pool."""
    seen: list[int] = []
    event.listen(engine, "checkout", lambda *_args: seen.append(1))
    return seen


def row(name: str) -> dict[str, object]:
    return {"name": name, "next_run_at": utcnow(), "term": 0, "active": True,
            "updated_at": utcnow()}


def terms(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {r.name: int(r.term) for r in conn.execute(select(SCHEDULES.c.name,
                                                                 SCHEDULES.c.term))}


def test_sessions_of_one_connection_commit_roll_back_and_check_out_once(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    seen = checkouts(engine)
    with one_connection(sessions) as shared:
        with shared.begin() as session:
            session.execute(insert(SCHEDULES), [row("a"), row("b")])
        with pytest.raises(ZeroDivisionError), shared.begin() as session:
            session.execute(update(SCHEDULES).where(SCHEDULES.c.name == "a").values(term=5))
            raise ZeroDivisionError  # the write above is rolled back
        with shared() as session:  # a read sees what committed before it
            assert session.execute(select(func.count()).select_from(SCHEDULES)).scalar() == 2
        with engine.begin() as other:  # another connection commits between two reads
            other.execute(update(SCHEDULES).where(SCHEDULES.c.name == "b").values(term=3))
        with shared() as session:
            assert session.execute(select(SCHEDULES.c.term).where(
                SCHEDULES.c.name == "b")).scalar() == 3
        used = len(seen) - 1  # less the other connection's checkout
    assert terms(engine) == {"a": 0, "b": 3}
    # Four sessions: one checkout where it is shared, one a session on SQLite.
    assert used == (4 if engine.dialect.name == "sqlite" else 1)


def test_a_session_inside_another_on_one_connection_is_refused(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """The inner session would join the outer one's transaction and be undone with it."""
    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite keeps a connection per session: nothing is shared")
    with one_connection(sessions) as shared:
        with shared() as outer:
            outer.execute(select(1))
            with pytest.raises(NestedSession), shared.begin() as inner:
                inner.execute(insert(SCHEDULES), [row("lost")])
        with shared.begin() as session:  # the connection still serves the next session
            session.execute(insert(SCHEDULES), [row("kept")])
        # Work on several connections at once uses the pool, not the shared one.
        with pooled(shared)() as first, pooled(shared)() as second:
            assert first.connection() is not second.connection()
    assert terms(engine) == {"kept": 0}


def test_rounds_of_several_jobs_read_the_bounds_and_the_schedules_once(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis
) -> None:
    """Two jobs over one table: one read of its bounds and one of the two schedule rows for
    both rounds; a row added above those bounds is planned by the next reconcile."""
    seed_cm_data(engine, 2000)  # partitions of 1,000 ids: two each
    jobs = [small(), dataclasses.replace(small(), name="cm_twin")]
    start(sessions, redis_client)
    activate(sessions, jobs[1])
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _c, _cur, sql, *_rest: statements.append(sql))

    def reconcile() -> list[int]:
        with sessions.begin() as session:
            session.execute(update(SCHEDULES).values(next_run_at=utcnow()))
        shared = Shared([job.name for job in jobs])
        statements.clear()
        with one_connection(sessions) as one:
            planned = [reconcile_job(one, redis_client, job, lambda _j, _p: None,
                                     interval=60, grace=0, shared=shared).planned
                       for job in jobs]
        return planned

    assert reconcile() == [2, 2]
    reads = [s for s in statements if "FROM cm_data" in s]
    assert len(reads) == 1, reads
    assert len([s for s in statements if "schedules.term, schedules.next_run_at" in s]) == 1
    add_row(engine, 2500)
    assert reconcile() == [1, 1]  # its partition, for each job
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(WORK)).scalar() == 6


def test_many_rows_inserted_at_once_get_the_defaults_an_insert_gives(engine: Engine) -> None:
    """`insert_many` (COPY on PostgreSQL): the rows as given, the columns left out at their
    defaults, a text with a tab, a newline and a backslash kept as it is, in the caller's
    transaction (rolled back with it)."""
    rows = [{"kind": "range", "job": "copied", "part": p, "lo": p * 10, "hi": p * 10 + 9,
             "next_id": p * 10, "status": "pending", "error": None if p else "a\tb\nc\\d"}
            for p in range(3)]
    with pytest.raises(ZeroDivisionError), Session(engine) as session, session.begin():
        insert_many(session, WORK, rows)
        raise ZeroDivisionError
    with Session(engine) as session, session.begin():
        insert_many(session, WORK, rows)
        insert_many(session, WORK, [])
    with engine.connect() as conn:
        found = conn.execute(select(WORK).order_by(WORK.c.part)).all()
    assert [(r.part, r.lo, r.hi, r.next_id, r.error) for r in found] == [
        (0, 0, 9, 0, "a\tb\nc\\d"), (1, 10, 19, 10, None), (2, 20, 29, 20, None)]
    assert {(r.fence, r.claims, r.rows_done, r.rate, r.crashes, r.rows_skipped, r.owner)
            for r in found} == {(0, 0, 0, 0.0, 0, 0, None)}
