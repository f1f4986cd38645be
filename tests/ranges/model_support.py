"""Parts of the model-based test of the range protocol (tests/ranges/test_model.py): a fake
lease clock, holders stopped at a batch boundary or by a crash, holders paused in another
thread, and plain reads of what the database holds.

Every holder runs the real `PartitionRunner`. Where it stops is chosen through the runner's own
seams, never by timing:

- `Budget` is the runner's shutdown flag: it says "stop" (a graceful hand-back) or raises
  `Crash` (the process dies at a batch boundary, nothing released) after N loop turns.
- `crashing` wraps the job's process function: it raises `Crash` inside the N-th batch's
  transaction, which rolls back.
- `Paused` runs a holder in a thread and parks it either before a batch (the job's
  `throttle_on`, asked after the lease check and before the batch's transaction) or right after
  the batch read its rows (an engine event, before the guard: the runner docstring's t1), until
  the model lets it go. The main thread never runs beside it: it waits until the holder parked
  or ended, and after letting it go, until it ended.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import redis
from sqlalchemy import Engine, Row, delete, event, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from examples.tables import CM_DATA
from lease import Leases
from lease.keys import lease_key
from tasks.ranges.controls import ControlRefused, Controls
from tasks.ranges.jobs import Context, RangeJob
from tasks.ranges.reconciler import Round, activate, reconcile_job
from tasks.ranges.runner import PartitionRunner
from tasks.ranges.tables import RANGE_RUNS, SCHEDULES, WORK
from tasks.ranges.workrow import every_partition
from tasks.store.db import utcnow
from tasks.store.models import Base

__all__ = ["Env", "step", "FakeClock", "Budget", "Crash", "crashing", "Paused", "Work", "Data",
           "reset", "work_rows", "data_rows", "run_state", "expire", "watch_reads",
           "insert_rows", "delete_rows", "check_fence", "assert_reached", "start_run",
           "round_now", "holder_options", "BEFORE_BATCH", "AFTER_READ"]

BEFORE_BATCH = "before-batch"  # parked after its lease check, before the batch transaction
AFTER_READ = "after-read"  # parked inside the batch transaction, rows read, guard not yet run
PARK_TIMEOUT = 60.0  # seconds a handshake may take before the test calls it a hang

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Env:
    """What a model runs on: one database (`kind`), its sessions, the test Redis."""

    engine: Engine
    sessions: sessionmaker[Session]
    client: redis.Redis
    kind: str


def start_run(env: Env, controls: Controls, job: RangeJob) -> bool:
    """What the start task does: `Controls.start`, then a reconcile round now (and `activate`,
    which the start task called at dcdb868 and `Controls.start` does today). False: refused."""
    try:
        controls.start(job.name, "model")
    except ControlRefused:
        return False
    activate(env.sessions, job)
    round_now(env, job)
    return True


def round_now(env: Env, job: RangeJob) -> Round:
    """One reconcile round, due now, every open partition free to go out; it sends nothing."""
    with env.sessions.begin() as session:
        session.execute(update(SCHEDULES).values(next_run_at=utcnow() - timedelta(hours=1)))
        session.execute(update(WORK).values(dispatched_at=None))
    return reconcile_job(env.sessions, env.client, job, lambda _job, _part: None, interval=60,
                         grace=0, settle=0)


def holder_options(env: Env, leases: Leases, clock: FakeClock, shutdown: Budget, owner: str,
                   **more: Any) -> dict[str, Any]:
    """A `PartitionRunner`'s keywords: the model's leases and clock, no retry waits, no
    redelivery cap (crashes are the model's), no time slice."""
    return {"sessions": env.sessions, "leases": leases, "lease_ttl": 30.0, "owner": owner,
            "shutdown": shutdown, "clock": clock, "retry_delays": (0.01,), "crash_cap": 10**6,
            "time_slice": 1e9, **more}


def step(fn: F) -> F:
    """Mark the machine busy while `fn` runs (and count the step): a teardown that finds it
    busy follows a failure and only lets held threads go (driving to the end would hide the
    failure)."""

    @functools.wraps(fn)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.busy = True
        self.seen(f"step {fn.__name__}")
        result = fn(self, *args, **kwargs)
        self.busy = False
        return result

    return wrapped  # type: ignore[return-value]


class FakeClock:
    """The monotonic clock of the leases and runners: it moves only when the model says."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Crash(BaseException):
    """The holder's process dies here: no handler of the runner sees it (not an Exception)."""


class Budget:
    """A runner's shutdown flag that is set after `turns` turns of its batch loop; with
    `crash`, the process dies there instead of handing the partition back."""

    def __init__(self, turns: int, *, crash: bool = False) -> None:
        self.left, self.crash = turns, crash

    def is_set(self) -> bool:
        if self.left > 0:
            self.left -= 1
            return False
        if self.crash:
            raise Crash()
        return True


def crashing(job: RangeJob, batches: int) -> RangeJob:
    """`job` whose process dies inside its transaction on the batch after `batches` batches."""
    calls = [0]

    def process(rows: Sequence[Row[Any]], ctx: Context) -> None:
        calls[0] += 1
        if calls[0] > batches:
            raise Crash()
        job.process(rows, ctx)

    return _replace(job, process=process)


def _replace(job: RangeJob, **changes: Any) -> RangeJob:
    return dataclasses.replace(job, **changes)


class Paused:
    """A holder of `part` run in its own thread and parked at `point` on its `turn`-th batch.

    `start` returns once it parked (`parked` True) or ended without reaching that batch;
    `release` lets it go on and returns once its run ended (its outcome in `outcome`)."""

    def __init__(self, engine: Engine, job: RangeJob, part: int, point: str, turn: int,
                 **runner: Any) -> None:
        self.engine, self.part, self.point, self.turn = engine, part, point, turn
        self.calls = 0
        self.fence: int | None = None  # the fence it claimed with, read once it parked
        self.outcome: str | None = None
        self.error: BaseException | None = None
        self._parked, self._go, self._ended = threading.Event(), threading.Event(), False
        if point == BEFORE_BATCH:
            job = _replace(job, throttle_on=self._before_batch)
        self.runner = PartitionRunner(job, part, **runner)
        self.thread = threading.Thread(target=self._run, name=f"paused-{part}", daemon=True)

    @property
    def parked(self) -> bool:
        return not self._ended

    def start(self) -> None:
        if self.point == AFTER_READ:
            assert event.contains(self.engine, "after_cursor_execute", _after_cursor_execute), (
                "watch_reads(engine) first")
            _READERS[self.thread] = self
        self.thread.start()
        if not self._parked.wait(PARK_TIMEOUT):
            raise AssertionError(f"holder of part {self.part} neither parked nor ended")
        if self._ended:
            self._join()

    def release(self) -> None:
        self._go.set()
        self._join()

    def _join(self) -> None:
        self.thread.join(PARK_TIMEOUT)
        if self.thread.is_alive():
            raise AssertionError(f"holder of part {self.part} did not end after its release")
        _READERS.pop(self.thread, None)

    def _run(self) -> None:
        try:
            self.outcome = self.runner.run()
        except BaseException as exc:  # reported by the model, never lost in the thread
            self.error = exc
        finally:
            self._ended = True
            self._parked.set()

    def _park(self) -> None:
        self._parked.set()
        if not self._go.wait(PARK_TIMEOUT):
            raise AssertionError(f"holder of part {self.part} was never let go")

    def _before_batch(self, _job: RangeJob) -> None:
        self.calls += 1
        if self.calls == self.turn:
            self._park()

    def after_read(self, statement: str) -> None:
        if "ORDER BY" in statement and "cm_data" in statement and "SELECT" in statement:
            self.calls += 1
            if self.calls == self.turn:
                self._park()


# The holders parked after a read, by their thread. One listener per engine, added once and
# never removed while the engine is in use: SQLAlchemy iterates an event's listeners without
# a lock, so adding or removing one while another thread executes a statement breaks it.
_READERS: dict[threading.Thread, Paused] = {}


def watch_reads(engine: Engine) -> None:
    """Let holders of `engine` park after a read (call before any holder runs)."""
    if not event.contains(engine, "after_cursor_execute", _after_cursor_execute):
        event.listen(engine, "after_cursor_execute", _after_cursor_execute)


def _after_cursor_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
    holder = _READERS.get(threading.current_thread())
    if holder is not None:
        holder.after_read(statement)


@dataclass(frozen=True)
class Work:
    """A partition's work row as the invariants read it."""

    part: int
    lo: int
    hi: int
    next_id: int
    fence: int
    status: str
    error: str | None


@dataclass(frozen=True)
class Data:
    """A row of cm_data as the invariants read it."""

    id: int
    status: int
    count: int
    fence: int


def reset(engine: Engine, client: redis.Redis) -> None:
    """Every table empty and the test Redis database flushed: one example's clean start."""
    with engine.begin() as conn:
        for table in (*reversed(Base.metadata.sorted_tables), CM_DATA):
            conn.execute(delete(table))
    client.flushdb()


def work_rows(engine: Engine) -> dict[int, Work]:
    with engine.connect() as conn:
        rows = conn.execute(select(WORK.c.part, WORK.c.lo, WORK.c.hi, WORK.c.next_id,
                                   WORK.c.fence, WORK.c.status, WORK.c.error)
                            .where(every_partition())).all()
    return {r.part: Work(r.part, r.lo, r.hi, r.next_id, int(r.fence), str(r.status), r.error)
            for r in rows}


def data_rows(engine: Engine) -> dict[int, Data]:
    with engine.connect() as conn:
        rows = conn.execute(select(CM_DATA.c.id, CM_DATA.c.status, CM_DATA.c.processed_count,
                                   CM_DATA.c.processed_fence)).all()
    return {int(r.id): Data(int(r.id), int(r.status), int(r.processed_count),
                            int(r.processed_fence)) for r in rows}


def run_state(engine: Engine) -> tuple[int, str] | None:
    """The job's latest run: (id, state), or None before its first start."""
    with engine.connect() as conn:
        row = conn.execute(select(RANGE_RUNS.c.id, RANGE_RUNS.c.state)
                           .order_by(RANGE_RUNS.c.id.desc()).limit(1)).first()
    return None if row is None else (int(row.id), str(row.state))


def expire(client: redis.Redis, job: RangeJob, parts: Sequence[int]) -> None:
    """The leases of `parts` expire in Redis (their holders are not told)."""
    if parts:
        client.delete(*[lease_key(job.lease_name(p)) for p in parts])


def insert_rows(engine: Engine, ids: Sequence[int]) -> None:
    """Rows to do with explicit ids, committed in one short transaction."""
    if ids:
        with engine.begin() as conn:
            conn.execute(insert(CM_DATA), [
                {"id": i, "status": 0, "payload": f"row-{i}", "processed_count": 0,
                 "processed_fence": 0} for i in ids])


def delete_rows(engine: Engine, ids: Sequence[int]) -> None:
    if ids:
        with engine.begin() as conn:
            conn.execute(delete(CM_DATA).where(CM_DATA.c.id.in_(ids)))


def check_fence(row: Data, work: dict[int, Work], before: dict[int, Work],
                fences: dict[int, set[int]]) -> None:
    """`row` was processed in the step that just ran: by a holder of its partition (a fence
    seen on it), not by one fenced out before the step began (`before`: the partitions then)."""
    holding = [w for w in work.values() if w.lo <= row.id <= w.hi]
    assert holding, f"row {row.id} was processed but lies in no partition"
    part = holding[0].part
    was = before.get(part)
    floor = was.fence if was is not None and was.lo == holding[0].lo else 0
    assert row.fence in fences[part], (
        f"row {row.id} carries fence {row.fence}, which never held partition {part} "
        f"(seen: {sorted(fences[part])})")
    assert row.fence >= floor, (
        f"row {row.id} was processed with fence {row.fence} although partition {part} was "
        f"held by fence {floor} when this step began: a fenced-out holder's write landed")


def assert_reached(seen: dict[str, int], *, after_read: bool) -> None:
    """The examples are fixed (derandomized): they must still reach what the model is for (a
    change of the code or of the strategies could make them miss it without failing)."""
    wanted = ["holder: fenced-out", "holder: done", "run: succeeded", "step crash_holder",
              f"pause {BEFORE_BATCH}: parked", "step redis_restarts_empty"]
    if after_read:
        wanted.append(f"pause {AFTER_READ}: parked")
    missing = [what for what in wanted if not seen.get(what)]
    assert not missing, f"the examples never reached {missing}: raise MODEL_EXAMPLES"
