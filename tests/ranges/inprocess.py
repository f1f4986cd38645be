"""A range job run to its end in the test process: one reconcile round plans and "dispatches"
its partitions, then each runs here in turn (no worker, no broker)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis
from sqlalchemy.orm import Session, sessionmaker

from lease import Leases
from tasks.ranges.jobs import RangeJob
from tasks.ranges.reconciler import activate, reconcile_job
from tasks.ranges.runner import PartitionRunner

__all__ = ["run_all"]


def run_all(job: RangeJob, sessions: sessionmaker[Session], leases: Leases,
            client: redis.Redis, clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Plan `job` and run each of its partitions here; their outcomes, in order. `clock` times
    the batches (a test's own clock makes batch times exact)."""
    activate(sessions, job)
    parts: list[int] = []
    reconcile_job(sessions, client, job, lambda _j, p: parts.append(p), interval=1, grace=0)
    return [PartitionRunner(job, part, sessions=sessions, leases=leases, lease_ttl=10.0,
                            owner="test", shutdown=threading.Event(), clock=clock).run()
            for part in parts]
