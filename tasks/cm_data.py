"""The demo range job `cm_data` (seed 000): mark every row with `status = 0` processed.

Each processed row gets `status = 1`, `processed_count + 1` and the fence of the lease holder
that processed it, so a check afterwards can prove every row was processed exactly once.

Its knobs are read once, when the module is imported (a bad value stops the worker at start-up
with a message naming the variable):

| variable | default | meaning |
| --- | --- | --- |
| `CM_DATA_PARTITION_SIZE` | 2000000 | ids per partition (applies to partitions planned later) |
| `CM_DATA_BATCH_SIZE` | 1000 | rows per batch |
| `CM_DATA_PARALLELISM` | 2 | threads per batch for `ctx.map` |
| `CM_DATA_WORK` | trivial | `cpu` adds real CPU work per row (benchmarks) |
| `CM_DATA_BATCH_DELAY` | 0 | seconds each batch sleeps, so chaos tests can act mid-partition |
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Row, update

from tasks.jobs import Context, RangeJob, register
from tasks.models import CM_DATA, CmData
from tasks.settings import SettingsError

__all__ = ["cm_data", "mark_processed", "cpu_work", "CmDataConfig", "load_config", "CONFIG"]

CPU_ROUNDS = 2000
WORK_KINDS = ("trivial", "cpu")

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class CmDataConfig:
    """The demo job's knobs (see the module docstring)."""

    partition_size: int = 2_000_000
    batch_size: int = 1000
    parallelism: int = 2
    work: str = "trivial"
    batch_delay: float = 0.0


def _number(env: Mapping[str, str], name: str, cast: Callable[[str], N], default: N,
            minimum: N) -> N:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw[:32]!r} is not a number") from None
    if not value >= minimum:
        raise SettingsError(f"{name}={raw[:32]!r} must be at least {minimum:g}")
    return value


def load_config(env: Mapping[str, str] | None = None) -> CmDataConfig:
    """Read the CM_DATA_* knobs from `env` (default `os.environ`); `SettingsError` if bad."""
    env = os.environ if env is None else env
    work = env.get("CM_DATA_WORK", "").strip() or "trivial"
    if work not in WORK_KINDS:
        raise SettingsError(f"CM_DATA_WORK={work[:32]!r} must be one of {', '.join(WORK_KINDS)}")
    return CmDataConfig(
        partition_size=_number(env, "CM_DATA_PARTITION_SIZE", int, 2_000_000, 1),
        batch_size=_number(env, "CM_DATA_BATCH_SIZE", int, 1000, 1),
        parallelism=_number(env, "CM_DATA_PARALLELISM", int, 2, 1),
        work=work,
        batch_delay=_number(env, "CM_DATA_BATCH_DELAY", float, 0.0, 0.0),
    )


CONFIG = load_config()


def cpu_work(row: Any) -> bytes:
    """A few milliseconds of hashing that releases the GIL (so threads run in parallel)."""
    return hashlib.pbkdf2_hmac("sha256", str(row.payload).encode(), b"cm_data", CPU_ROUNDS)


def mark_processed(rows: Sequence[Row[Any]], ctx: Context) -> None:
    """The batch's effect: one UPDATE inside the checkpoint's transaction."""
    if CONFIG.work == "cpu":
        ctx.map(cpu_work, rows)
    if CONFIG.batch_delay > 0:
        time.sleep(CONFIG.batch_delay)
    table = CM_DATA
    ctx.session.execute(
        update(table)
        .where(table.c.id.in_([row.id for row in rows]))
        .values(status=1, processed_count=table.c.processed_count + 1, processed_fence=ctx.fence)
    )


cm_data = register(
    RangeJob(
        name="cm_data",
        table=CM_DATA,
        where=CmData.status == 0,
        process=mark_processed,
        columns=("id", "payload"),
        partition_size=CONFIG.partition_size,
        batch_size=CONFIG.batch_size,
        parallelism=CONFIG.parallelism,
    )
)
