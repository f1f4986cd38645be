"""The atomic claim of pending partitions (tasks/ranges/claims.py) on all three databases:
claimers racing on threads never get the same partition, and a reservation lapses."""

from __future__ import annotations

import threading

from sqlalchemy import Engine, insert, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.claims import claim_pending
from tasks.ranges.tables import WORK
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import RANGE_KIND

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
