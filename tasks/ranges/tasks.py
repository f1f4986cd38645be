"""Celery tasks of range jobs: `start`, `reconcile` (beat), `run_partition`, the controls
`pause`, `resume`, `cancel`, `retry_failed`, `retry_skipped`, `throttle`
(`tasks.ranges.controls`), `schedules` (beat: the jobs' cron schedules,
`tasks.ranges.timetable`) and `hook` (a run end's hook, `tasks.ranges.outbox`).

    celery -A tasks call tasks.ranges.start --args '["cm_data"]'
    celery -A tasks call tasks.ranges.start --kwargs '{"job": "backfill", "params": {"tenant": 42}}'
    celery -A tasks call tasks.ranges.pause --args '["cm_data"]'
    celery -A tasks call tasks.ranges.throttle --args '["cm_data", 2000]'

A refused control or start (unknown job, bad rate, a run in no state for it) raises
`InvalidArguments`, an expected outcome (`throws`): the worker logs it as one line.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from celery import Task
from redis.exceptions import RedisError
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from tasks.celery import app, settings
from tasks.ranges.closing import nothing_open
from tasks.ranges.controls import Controls, Then
from tasks.ranges.jobs import get_job, registered_jobs, validate_job_name, validate_part
from tasks.ranges.keeper import RunnerKeeper
from tasks.ranges.outbox import Again, deliver, run_hook
from tasks.ranges.poolexit import PartitionRequest, PoolWatch, holder_name
from tasks.ranges.pull import Pull, Pulled
from tasks.ranges.reconciler import (
    Round,
    Runners,
    Shared,
    active_jobs,
    due_now,
    reconcile_job,
    repair_inactive,
)
from tasks.ranges.runner import Outcome, PartitionRunner, Progress
from tasks.ranges.runners import RunnerSlots, new_token, validate_token
from tasks.ranges.settings import range_settings
from tasks.ranges.timetable import tick
from tasks.store.db import one_connection
from tasks.store.resources import resources_for
from tasks.store.validate import InvalidArguments
from tasks.worker.controlplane import ROUND
from tasks.worker.lifecycle import shutdown_requested

__all__ = ["start", "reconcile", "run_partition", "PROGRESS", "pause", "resume", "cancel",
           "retry_failed", "retry_skipped", "throttle", "controls", "start_job", "hook",
           "schedules"]

# Custom task state shown by Flower while a partition runs.
PROGRESS = "PROGRESS"
PROGRESS_EVERY = 1.0  # seconds between progress updates to the result backend

log = logging.getLogger("tasks.ranges")


# The worker's main process keeps the runner messages it holds counted (tasks.ranges.keeper).
app.steps["worker"].add(RunnerKeeper)
app.steps["worker"].add(PoolWatch)


def _dispatch(job: str, part: int) -> None:
    run_partition.apply_async((job, part))


def _spawn(job: str, token: str) -> None:
    """Send a runner message of `job`: its task claims the job's partitions itself."""
    run_partition.apply_async((job, None, token))


def _grace() -> float:
    return max(settings.lease_ttl, 2 * settings.reconcile_interval)


def _slots(job: str) -> RunnerSlots:
    ranges = range_settings(settings)
    # A running runner's token counts while its batches go on; 3 TTLs cover a slow batch.
    return RunnerSlots(resources_for(settings).redis, job, ranges.runners,
                       wait=ranges.runner_wait, alive=3 * settings.lease_ttl)


def _round(job_name: str, sessions: sessionmaker[Session] | None = None,
           shared: Shared | None = None) -> Round:
    """`job_name`'s round on `sessions`; alone (a control's kick), on a connection of its
    own for the whole round."""
    res = resources_for(settings)
    if sessions is None:
        with one_connection(res.sessions) as own:
            return _round(job_name, own, shared)
    return reconcile_job(
        sessions, res.redis, get_job(job_name), _dispatch,
        interval=settings.reconcile_interval, grace=_grace(),
        settle=range_settings(settings).settle,
        runners=Runners(_slots(job_name), _spawn), shared=shared,
    )


def _report(r: Round) -> dict[str, Any]:
    return {"job": r.job, "ran": r.ran, "planned": r.planned, "reopened": r.reopened,
            "late": r.late, "dispatched": r.dispatched, "overtaken": r.overtaken,
            "held": r.held, "run_state": r.run, "closing_s": r.closing_s, "runners": r.runners}


def controls() -> Controls:
    """The range-job controls on this process's resources (the CLI uses them too)."""
    res = resources_for(settings)
    return Controls(res.sessions, res.redis, lambda job: _report(_round(job)))


def _actor(task: Task) -> str:
    return f"task:{task.request.id}" if task.request.id else "task:eager"


def start_job(job: str, actor: str, params: object = None,
              then: Then | None = None, records: list[str] | None = None) -> dict[str, Any]:
    """Start range job `job` with run parameters `params` (a mapping of names to values, or
    None; a new run unless one is live; a paused run is refused) and, for a CSV job, its
    input `records` (`tasks.ranges.collections.read_csv`): check them, open the run (its
    input stored), activate the job and reset its failed partitions in one transaction, then
    reconcile now (or, if Redis is away, at beat's next round). The CLI's `jobs start` too,
    and a schedule's fire, whose `then` commits with the run (`Controls.start`)."""
    found = get_job(job)
    control = controls()
    opened = control.start(found.name, actor, params, then=then, records=records)
    report = {"job": found.name, **control.kick_quietly(found.name)}
    deferred = [r["deferred"] for r in (opened, report) if "deferred" in r]
    report.update(**opened)
    if deferred:
        report["deferred"] = "; ".join(deferred)
    return report


@app.task(name="tasks.ranges.start", bind=True, throws=(InvalidArguments,),
          control_plane=True)
def start(self: Task, job: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start range job `job` with run parameters `params`: see `start_job`."""
    return start_job(job, _actor(self), params)


@app.task(name="tasks.ranges.pause", bind=True, throws=(InvalidArguments,),
          control_plane=True)
def pause(self: Task, job: str) -> dict[str, Any]:
    """Pause `job`: each running partition commits its batch, releases its lease, is paused."""
    return controls().pause(job, _actor(self))


@app.task(name="tasks.ranges.resume", bind=True, throws=(InvalidArguments,),
          control_plane=True)
def resume(self: Task, job: str) -> dict[str, Any]:
    """Resume a paused `job`: its paused partitions are dispatched at once."""
    return controls().resume(job, _actor(self))


@app.task(name="tasks.ranges.cancel", bind=True, throws=(InvalidArguments,),
          control_plane=True)
def cancel(self: Task, job: str) -> dict[str, Any]:
    """Cancel `job`'s run (pause, and the run ends); `start` begins a new run afterwards."""
    return controls().cancel(job, _actor(self))


@app.task(name="tasks.ranges.retry_failed", bind=True, throws=(InvalidArguments,),
          control_plane=True)
def retry_failed(self: Task, job: str) -> dict[str, Any]:
    """Failed partitions of `job` go back to pending, keeping their checkpoints."""
    return controls().retry_failed(job, _actor(self))


@app.task(name="tasks.ranges.retry_skipped", bind=True, throws=(InvalidArguments,),
          control_plane=True)
def retry_skipped(self: Task, job: str) -> dict[str, Any]:
    """The rows `job`'s latest run quarantined run again, each once (tasks.ranges.retries)."""
    return controls().retry_skipped(job, _actor(self))


@app.task(name="tasks.ranges.throttle", bind=True, throws=(InvalidArguments,),
          control_plane=True)
def throttle(self: Task, job: str, rows_per_s: float) -> dict[str, Any]:
    """Cap `job` at `rows_per_s` rows per second over all its partitions (0 lifts the cap)."""
    return controls().throttle(job, rows_per_s, _actor(self))


@app.task(name="tasks.ranges.reconcile", control_plane=ROUND)
def reconcile() -> list[dict[str, Any]]:
    """One reconcile round for every active job (beat emits this every few seconds), then
    the hooks of runs that ended are sent (`tasks.ranges.outbox`)."""
    jobs = registered_jobs()
    known = {job.name for job in jobs}
    # One connection for every job's round: a round opens several sessions a job.
    with one_connection(resources_for(settings).sessions) as sessions:
        repair_inactive(sessions, jobs)
        names = [name for name in active_jobs(sessions) if name in known]
        shared = Shared(names)  # what every job's round would read alike, read once
        rounds = [_report(_round(name, sessions, shared)) for name in names]
        deliver(sessions, _send_hook, range_settings(settings).hook_resend, _declared)
    return rounds


def _declared(job: str, state: str) -> bool:
    """Whether `job` (registered here) declares a hook for a run that ended in `state`."""
    return job in {j.name for j in registered_jobs()} and get_job(job).hook_for(state) is not None


def _send_hook(run_id: int, state: str, task_id: str) -> None:
    hook.apply_async((run_id, state), task_id=task_id)


@app.task(name="tasks.ranges.hook", bind=True, acks_late=True, max_retries=None)
def hook(self: Task, run_id: int, state: str) -> dict[str, Any]:
    """Run the hook of run `run_id`, which ended in `state`, if this message owns it (a
    duplicate, or one sent again, does nothing); retried with HOOK_RETRY when it raises
    (`tasks.ranges.outbox.run_hook`)."""
    try:
        return run_hook(resources_for(settings).sessions, app, _hook_of, int(run_id),
                        str(state), self.request.id or "", self.request.retries)
    except Again as again:
        raise self.retry(exc=again.__cause__, countdown=again.countdown) from again.__cause__


def _hook_of(job: str, state: str) -> Any:
    return get_job(job).hook_for(state)


@app.task(name="tasks.ranges.schedules", control_plane=ROUND)
def schedules() -> list[dict[str, Any]]:
    """Fire the jobs' due cron schedules (the leader beat emits this every
    RANGE_SCHEDULE_TICK seconds; `tasks.ranges.timetable`)."""
    res = resources_for(settings)
    fires = tick(res.sessions, registered_jobs(),
                 start=lambda job, actor, then: start_job(job, actor, None, then),
                 cancel=lambda job, actor: controls().cancel(job, actor),
                 grace=range_settings(settings).schedule_grace)
    return [fire.as_dict() for fire in fires]


def _close_if_last(job: str) -> None:
    """The holder of the job's last open partition runs the closing round now, instead of
    leaving it to beat's next round (up to RECONCILE_INTERVAL later). Best effort: beat's
    round does the same if this one is overtaken or Redis or the database is away."""
    sessions = resources_for(settings).sessions
    try:
        if nothing_open(sessions, job):
            due_now(sessions, job)
            _round(job)
    except (RedisError, OSError, OperationalError) as exc:
        log.info("range %s: closing round left to beat (%s)", job, type(exc).__name__)


class _Slot:
    """The runner slot of one task: its token (None: an old-style message that has not
    become a runner), kept counting while the task runs (`tasks.ranges.runners`)."""

    def __init__(self, slots: RunnerSlots, token: str | None) -> None:
        self.slots, self.token = slots, token
        self._marked = time.monotonic()

    def keep_going(self) -> bool:
        """Before each claim: the slot still counts, or the job has room for it."""
        if self.token is None:
            self.token = new_token()
        self._marked = time.monotonic()
        try:
            return self.slots.running(self.token)
        except (RedisError, OSError):
            return True  # Redis is away: the next lease acquire says so and ends the loop

    def alive(self) -> None:
        """At a batch's progress: the slot counts a while longer (at most every TTL / 4)."""
        if self.token is not None and time.monotonic() - self._marked > settings.lease_ttl / 4:
            self.keep_going()

    def end(self, job: str, pulled: Pulled) -> None:
        """Send the continuation (same token, the partition handed back) or free the slot."""
        if pulled.more and self.token is not None:
            self.slots.sent([self.token])
            run_partition.apply_async((job, pulled.handed_back, self.token))
        elif pulled.more and pulled.handed_back is not None:
            _dispatch(job, pulled.handed_back)
        elif self.token is not None:
            try:
                self.slots.ended(self.token)
            except (RedisError, OSError):
                pass  # the token stops counting by its score


def _progress_reporter(task: Task, slot: _Slot) -> Callable[[Progress], None]:
    last_update = [0.0]

    def progress(p: Progress) -> None:
        slot.alive()
        now = time.monotonic()
        if now - last_update[0] >= PROGRESS_EVERY and task.request.id:
            last_update[0] = now
            try:
                task.update_state(state=PROGRESS, meta={
                    "job": p.job, "part": p.part, "checkpoint": p.checkpoint, "hi": p.hi,
                    "rows_done": p.rows_done, "rows_per_s": round(p.rows_per_s, 1)})
            except (RedisError, OSError) as exc:
                # Best effort: the batch is committed; a result backend that is briefly away
                # must not fail the partition. The work table has the same figures.
                log.warning("range %s part %s: progress not reported (%s)", p.job, p.part,
                            type(exc).__name__)
    return progress


@app.task(name="tasks.ranges.run_partition", bind=True, acks_late=True,
          Request=PartitionRequest)
def run_partition(self: Task, job: str, part: int | None,
                  runner: str | None = None) -> dict[str, Any]:
    """Work partition `part` of `job` under its lease (a duplicate delivery exits at once),
    then, as a runner of the job, claim and run its next pending partitions until none is
    left, the time slice ends or the job is paused (`tasks.ranges.pull`). A message with a
    `runner` token and no `part` is the reconciler's runner; one with only `part` (queued by
    an older version, or an orphan's) becomes a runner if the job has room for one. If its
    pool process dies, the worker's main process hands its partitions back at once
    (`tasks.ranges.poolexit`)."""
    validate_job_name(job)
    if part is not None:
        part = validate_part(part)
    found = get_job(job)
    res = resources_for(settings)
    slot = _Slot(_slots(found.name), validate_token(runner) if runner is not None else None)
    if runner is not None and not slot.keep_going():
        return {"job": found.name, "runner": runner, "outcome": "surplus", "runs": []}
    progress = _progress_reporter(self, slot)
    # Adoption only while two time slices fit in the task's soft time limit.
    may_adopt = 2 * range_settings(settings).slice < settings.soft_time_limit

    def run(number: int, seconds: float) -> tuple[PartitionRunner, str]:
        one = PartitionRunner(
            found, number, sessions=res.sessions, leases=res.leases,
            lease_ttl=settings.lease_ttl,
            owner=holder_name(self.request.hostname or socket.gethostname(), os.getpid()),
            shutdown=shutdown_requested, time_slice=seconds, on_progress=progress,
            crash_cap=settings.redelivery_cap, may_adopt=may_adopt,
        )
        return one, one.run()

    pull = Pull(found, res.sessions, res.redis, run_one=run, hold=_grace(),
                budget=range_settings(settings).slice, shutdown=shutdown_requested,
                keep_going=slot.keep_going)
    pulled = pull.drive(part)
    slot.end(found.name, pulled)
    if pulled.drained or any(r["outcome"] in (Outcome.DONE, Outcome.EMPTY)
                             for r in pulled.runs[-1:]):
        _close_if_last(found.name)
    return {"job": found.name, "part": part, "runner": slot.token, "runs": pulled.runs,
            "outcome": pulled.runs[0]["outcome"] if pulled.runs else "idle",
            "rows": sum(r["rows"] for r in pulled.runs)}
