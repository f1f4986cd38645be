"""The atomic claim of pending partitions (tasks/ranges/claims.py) on all three databases:
claimers racing on threads never get the same partition, and a reservation lapses; and a
runner's loop over them (tasks/ranges/pull.py), in-process."""

from __future__ import annotations

import threading

import pytest
import redis
from sqlalchemy import Engine, insert, update
from sqlalchemy.orm import Session, sessionmaker

from lease import Leases
from tasks.ranges import claims
from tasks.ranges.claims import claim_pending
from tasks.ranges.keys import range_orphans_key
from tasks.ranges.pull import Pull
from tasks.ranges.runner import Outcome, PartitionRunner
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import RANGE_KIND
from tasks.store.db import utcnow
from tests.ranges.test_adopt import orphan, planned
from tests.ranges.test_runner import counts, runner

PARTS = 60


def plan(sessions: sessionmaker[Session], job: str = "cm_data", parts: int = PARTS) -> None:
    with sessions.begin() as session:
        session.execute(insert(WORK), [
            {"kind": RANGE_KIND, "job": job, "part": p, "lo": p * 10 + 1, "hi": p * 10 + 10,
             "next_id": p * 10 + 1, "fence": 0, "status": S.PENDING, "claims": 0,
             "rows_done": 0, "rate": 0.0, "crashes": 0} for p in range(parts)])


def test_claimers_on_threads_never_get_the_same_partition(engine: Engine) -> None:
    sessions = sessionmaker(engine)
    plan(sessions)
    plan(sessions, job="other", parts=5)  # another job's partitions are never claimed
    got: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def claimer(mine: list[int], n: int) -> None:
        start.wait()
        misses = 0
        while misses < 3:  # a SQLite claimer can lose a race for every candidate it read
            parts = claim_pending(sessions, "cm_data", n, hold=60)
            misses = 0 if parts else misses + 1
            mine.extend(parts)

    threads = [threading.Thread(target=claimer, args=(got[i], 1 + i % 2)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    claimed = [p for mine in got for p in mine]
    assert sorted(claimed) == list(range(PARTS))  # each once, none twice
    assert claim_pending(sessions, "cm_data", 5, hold=60) == []


def test_only_pending_unreserved_partitions_lowest_first(engine: Engine) -> None:
    sessions = sessionmaker(engine)
    plan(sessions, parts=6)
    with sessions.begin() as session:
        session.execute(update(WORK).where(WORK.c.part.in_([0, 2]))
                        .values(status=S.RUNNING))
        session.execute(update(WORK).where(WORK.c.part == 3).values(status=S.DONE))
    assert claim_pending(sessions, "cm_data", 2, hold=60) == [1, 4]
    assert claim_pending(sessions, "cm_data", 5, hold=60) == [5]
    assert claim_pending(sessions, "cm_data", 5, hold=60) == []
    # A reservation older than `hold` lapses: its reserver died before claiming the row.
    assert claim_pending(sessions, "cm_data", 5, hold=0) == [1, 4, 5]


def test_a_runner_loop_claims_an_orphan_first_then_every_pending_partition(
        engine: Engine, redis_client: redis.Redis, leases: Leases) -> None:
    """`tasks.ranges.pull` in-process: an orphan (its holder died) goes first, then the
    pending partitions lowest first, each claimed once; every row is processed once."""
    sessions = sessionmaker(engine, expire_on_commit=False)
    job = planned(engine, sessions, redis_client, 500)  # partitions 0..4
    with sessions.begin() as session:  # planned by the in-process round, which reserved them
        session.execute(update(WORK).values(dispatched_at=None))
    orphan(job, 3, sessions, leases, redis_client)
    redis_client.sadd(range_orphans_key(job.name), 3)
    order: list[int] = []

    def run_one(part: int, seconds: float) -> tuple[PartitionRunner, str]:
        order.append(part)
        one = runner(job, part, sessions, leases, time_slice=seconds)
        return one, one.run()

    pulled = Pull(job, sessions, redis_client, run_one=run_one, hold=60, budget=60,
                  shutdown=threading.Event(), keep_going=lambda: True).drive(None)
    assert order == [3, 0, 1, 2, 4]
    assert pulled.drained and not pulled.more
    assert [r["outcome"] for r in pulled.runs] == [Outcome.DONE] * 5
    assert counts(engine) == {1: 500}


def test_a_runner_loop_hands_on_at_the_end_of_its_slice(
        engine: Engine, redis_client: redis.Redis, leases: Leases) -> None:
    sessions = sessionmaker(engine, expire_on_commit=False)
    job = planned(engine, sessions, redis_client, 300)
    def run_one(part: int, seconds: float) -> tuple[PartitionRunner, str]:
        raise AssertionError("a runner past its slice claims nothing")

    pulled = Pull(job, sessions, redis_client, run_one=run_one, hold=60, budget=0,
                  shutdown=threading.Event(), keep_going=lambda: True).drive(None)
    assert pulled.more and not pulled.runs and pulled.handed_back is None


def test_a_claim_on_sqlite_walks_no_pending_row_it_does_not_take(engine: Engine) -> None:
    """At 100,000 partitions a claim that repeated the free test outside its subquery made
    SQLite walk every pending row by the index and test it against the subquery's list: the
    claim's UPDATE must find its rows by primary key, and the subquery by the index in
    partition order (no sort)."""
    if engine.dialect.name != "sqlite":
        pytest.skip("the one-statement claim is SQLite's")
    compiled = claims._TAKE.compile(dialect=engine.dialect)
    now = utcnow().isoformat(" ")
    values = compiled.construct_params(
        {"claim_job": "cm_data", "cutoff": now, "reserved_at": now, "n": 1})
    assert compiled.positiontup is not None
    with engine.connect() as conn:
        steps = [r[3] for r in conn.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {compiled}",
            tuple(values[name] for name in compiled.positiontup)).all()]
    assert steps[0] == "SEARCH work_items USING INTEGER PRIMARY KEY (rowid=?)", steps
    assert any("USING INDEX ix_work_items_job_status_part" in s for s in steps), steps
    assert not any("TEMP B-TREE" in s for s in steps), steps  # no sort of the pending rows
