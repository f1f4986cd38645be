"""What the control tests share: the platform with the control test jobs, the CLI as a user
runs it, the job's runs and leases as stored."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import redis
from sqlalchemy import Engine, func, select

from examples.tables import CM_DATA
from lease.keys import lease_key
from tasks.ranges.keys import range_lease_name
from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS
from tasks.ranges.tables import PartitionStatus as S
from tests import SAMPLE_MODULES
from tests.ranges.cluster import Platform
from tests.support import forkcli
from tests.support.workers import ROOT

__all__ = ["control_platform", "jobs_cli", "runs", "events", "holders", "processed", "idle",
           "statuses"]

DATA = CM_DATA


def control_platform(make: Callable[..., Platform], **env: str) -> Platform:
    """A platform whose workers also know the control test jobs (tests.support.control_jobs)."""
    return make(EXTRA_TASK_MODULES=f"{SAMPLE_MODULES},tests.support.control_jobs", **env)


def jobs_cli(cluster: Platform, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m tasks jobs ARGS...` exactly as an operator types it."""
    return forkcli.run([sys.executable, "-m", "tasks", "jobs", *args], cluster.env, ROOT, 60)


def runs(engine: Engine, job: str = "cm_data") -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(RANGE_RUNS).where(RANGE_RUNS.c.job == job)
                                 .order_by(RANGE_RUNS.c.id)).all())


def events(engine: Engine, job: str = "cm_data") -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(RANGE_RUN_EVENTS.c.verb).where(
            RANGE_RUN_EVENTS.c.job == job).order_by(RANGE_RUN_EVENTS.c.id)).scalars())


def holders(cluster: Platform, job: str = "cm_data") -> list[int]:
    """The partitions of `job` whose lease someone holds."""
    client = redis.Redis.from_url(cluster.redis_server.url)
    try:
        return [p.part for p in cluster.parts() if p.job == job
                and client.exists(lease_key(range_lease_name(job, p.part)))]
    finally:
        client.close()


def processed(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(DATA.c.status == 1)).scalar_one())


def idle(cluster: Platform, job: str = "cm_data") -> bool:
    """No partition of `job` running and no lease of it held."""
    parts = [p for p in cluster.parts() if p.job == job]
    return (bool(parts) and not any(p.status == S.RUNNING for p in parts)
            and not holders(cluster, job))


def statuses(cluster: Platform, job: str = "cm_data") -> set[str]:
    return {p.status for p in cluster.parts() if p.job == job}

