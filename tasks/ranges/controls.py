"""The controls of a range job's run, one function per verb, shared by the Celery tasks
(`tasks.ranges.pause` ...) and the operator CLI (`python -m tasks jobs pause JOB` ...):

    start         open a run that walks the whole stored plan again (a cancelled run's
                  partitions are planned anew, and a visit-once job's after any run)
    pause         every running partition commits its batch, releases its lease, is `paused`
    resume        paused partitions -> pending, dispatched at once
    cancel        like pause, and the run ends; `start` begins a new one from the job's filter
    retry-failed  failed partitions -> pending, from their checkpoints
    retry-skipped rows the latest run quarantined run again, once (`tasks.ranges.retries`)
    throttle      the run's cap in rows per second over all its partitions (0 lifts it)

Each one checks its arguments and the run's state first and refuses with `ControlRefused`
(an `InvalidArguments`) having changed nothing; then, in one transaction, compare-and-sets
the run's state, moves the partitions and records who asked (`range_run_events`); then copies
the run's state to the job's Redis control hash, which the runners read before each batch
(`tasks.ranges.gate`). The reconciler copies it again every round (`runs.enforce`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.collections import store_input
from tasks.ranges.cuts import probe
from tasks.ranges.jobs import CSV_INPUT, RangeJob, get_job
from tasks.ranges.keys import range_schedule_name
from tasks.ranges.params import as_text, values_of
from tasks.ranges.reconciler import activate_in
from tasks.ranges.retries import retry_rows
from tasks.ranges.runs import (
    Run,
    change_state,
    current_run,
    open_run,
    park_unleased,
    record,
    still_latest,
    write_flags,
    writing,
)
from tasks.ranges.tables import RANGE_RUNS, SCHEDULES, WORK, RunState
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.workrow import partitions_of, restart_finished
from tasks.store.db import affected, utcnow
from tasks.store.validate import InvalidArguments, quote

__all__ = ["Controls", "ControlRefused", "Overtaken", "Then", "VERBS", "MAX_RATE",
           "validate_rate"]

VERBS = ("pause", "resume", "cancel", "retry-failed", "retry-skipped", "throttle")
MAX_RATE = 1e9  # rows per second: anything above is a typo

# Runs one reconcile round of the job now, so what a control set pending is dispatched at
# once instead of at the next interval; returns the round's report.
Kick = Callable[[str], dict[str, Any]]


class ControlRefused(InvalidArguments):
    """The run is in no state for this control (or changed under it); nothing was changed."""


class Overtaken(ControlRefused):
    """A start's `then` step refused (a schedule's due time fired by another beat first); the
    start changed nothing."""


# A start's last step, in its transaction, given the run's id: False rolls the start back
# (tasks.ranges.timetable fires a due time with it, exactly once).
Then = Callable[[Session, int], bool]


class RunChanged(ControlRefused):
    """The run's state changed between the control's check and its write (a reconcile round
    ended it, another control landed first); nothing was changed."""


CONFLICT_TRIES = 3  # a control whose run changed under it checks the new state and tries again

Verb = Callable[..., dict[str, Any]]


def settled(verb: Verb) -> Verb:
    """`verb` again (up to CONFLICT_TRIES times) when the run changed under it: the new state
    is checked anew, so the control lands or is refused for what the run now is. (A start
    whose run number another start took meets its unique constraint: the same case.)"""
    @functools.wraps(verb)
    def again(*args: Any, **kwargs: Any) -> dict[str, Any]:
        for _ in range(CONFLICT_TRIES - 1):
            try:
                return verb(*args, **kwargs)
            except (RunChanged, IntegrityError):
                continue
        return verb(*args, **kwargs)
    return again


def validate_rate(value: object) -> float:
    """Rows per second: a finite number from 0 (no throttle) to MAX_RATE."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidArguments(f"rows_per_s must be a number, got {quote(value)}")
    try:
        rate = float(value)
    except ValueError:
        raise InvalidArguments(f"rows_per_s must be a number, got {quote(value)}") from None
    if not math.isfinite(rate) or not 0 <= rate <= MAX_RATE:
        raise InvalidArguments(f"rows_per_s must be between 0 (no throttle) and {MAX_RATE:g}, "
                               f"got {quote(value)}")
    return rate


@dataclass
class Controls:
    """The verbs, on one database, one Redis (the control hashes) and one way to `kick`."""

    sessions: sessionmaker[Session]
    client: Any
    kick: Kick

    @settled
    def start(self, job: str, actor: str, params: object = None,
              then: Then | None = None, records: list[str] | None = None) -> dict[str, Any]:
        """Open a run of `job` unless one is live (a paused run must be resumed or cancelled
        first); after a cancelled run the job's partitions are planned anew. `params` are the
        run's parameters (a mapping of names to text or JSON values, `tasks.ranges.params`),
        checked before anything is written. A CSV job's run takes its input, `records` (the
        CSV's records as JSON objects, `tasks.ranges.collections.read_csv`), stored with the
        run. The run, its input, the plan's reset and the job's schedule change in one
        transaction: a start that fails (the database away, a table it cannot plan,
        parameters or input refused) changes nothing; so does one whose `then` returns False
        (`Overtaken`). Two starts racing to open a run: the loser finds the winner's run in
        its transaction (or meets the run number's unique constraint), rolls back, and joins
        the winner's run."""
        found = get_job(job)
        name = found.name
        run = current_run(self.sessions, name)
        if run is not None and run.state == RunState.PAUSED:
            raise ControlRefused(f"start {name}: run {run.shown} is paused; resume it "
                                 "(tasks.ranges.resume) or cancel it first")
        stored = self._params_for(found, run, params)
        self._check_input(found, run, records)
        if found.input is None and found.pages is None:  # a collection's table is ours
            self._check_plannable(found)
        with writing(self.sessions) as session:
            if not still_latest(session, name, run):
                raise RunChanged(f"start {name}: the job's run changed while this start ran; "
                                 "nothing was changed, try again")
            if run is not None and run.state in RunState.LIVE:
                record(session, run.id, name, "start", actor, f"already {run.state}")
                _then(then, session, name, run.id)
                return {"run": run.shown, "replanned": 0,
                        "reset_failed": activate_in(session, name)}
            replanned = restarted = 0
            # A cancelled run's plan is made anew; a visit-once job's after every run (its
            # next run visits every row again, from a new plan: tasks.ranges.visits).
            if run is not None and (run.state == RunState.CANCELLED or found.visits_once):
                replanned = self._replan(session, name)
            else:  # the new run walks every stored partition again, counting from zero
                restarted = restart_finished(session, name)
            run_id, number = open_run(session, name, run, actor, found.rows_per_s, stored)
            if records is not None:
                store_input(session, name, run_id, records)
            reset = activate_in(session, name)
            _then(then, session, name, run_id)
        report: dict[str, Any] = {"run": number, "replanned": replanned,
                                  "restarted": restarted, "reset_failed": reset}
        if records is not None:
            report["input_lines"] = len(records)
        return self._copy_flags(name, report)

    @staticmethod
    def _params_for(job: RangeJob, run: Run | None, params: object) -> str | None:
        """The stored form of the new run's parameters; `InvalidParams` if refused. A live
        run is joined only with no parameters or the ones it runs with."""
        live = run is not None and run.state in RunState.LIVE
        if live and params is None:
            return None
        stored = job.make_params(params)[1]
        if run is not None and live and values_of(stored) != values_of(run.params):
            raise ControlRefused(f"start {job.name}: run {run.shown} is {run.state} with "
                                 f"parameters {as_text(values_of(run.params))}; cancel it first to "
                                 "start one with other parameters")
        return stored

    @staticmethod
    def _check_input(job: RangeJob, run: Run | None, records: list[str] | None) -> None:
        """A CSV job starts a run only with its input, and no other job takes one; a live
        run is joined only without."""
        if records is None:
            if job.input == CSV_INPUT and (run is None or run.state not in RunState.LIVE):
                raise ControlRefused(f"start {job.name}: a CSV job's run needs its input: "
                                     f"python -m tasks jobs start {job.name} --csv PATH")
            return
        if job.input != CSV_INPUT:
            raise ControlRefused(f"start {job.name}: the job takes no CSV (it is not a "
                                 "csv_job)")
        if run is not None and run.state in RunState.LIVE:
            raise ControlRefused(f"start {job.name}: run {run.id} is {run.state} with its "
                                 "own input; cancel it first to start one with this CSV")

    @staticmethod
    def _replan(session: Session, job: str) -> int:
        """Delete the job's partitions (the next round plans them anew), keeping their highest
        fence as the floor of the new ones: a holder of the old plan that wakes up must be
        fenced out even if Redis lost its fence counters meanwhile."""
        highest = session.execute(select(func.max(WORK.c.fence)).where(
            partitions_of(job))).scalar() or 0
        session.execute(update(SCHEDULES).where(
            SCHEDULES.c.name == range_schedule_name(job),
            SCHEDULES.c.fence_floor < highest).values(fence_floor=highest))
        return affected(session.execute(delete(WORK).where(
            partitions_of(job))))

    def _check_plannable(self, job: RangeJob) -> None:
        """Refuse a start whose first reconcile round could not plan: the job's table
        cannot be read (missing, no such column); a database that is away raises as is."""
        try:
            with self.sessions() as session:
                probe(session, job)  # the key in key order, as planning reads it
        except DBAPIError as exc:
            if not _refusal(exc):
                raise  # the database is away or busy: not the job's fault
            what = "keys" if job.keyed else "ids"
            reason = " ".join(str(getattr(exc, "orig", exc)).split())[:300]
            raise ControlRefused(f"start {job.name}: cannot read the {what} of table "
                                 f"{job.table.name}: {reason}") from None

    @settled
    def pause(self, job: str, actor: str) -> dict[str, Any]:
        return self._halt(job, "pause", (RunState.RUNNING,), RunState.PAUSED, actor)

    @settled
    def resume(self, job: str, actor: str) -> dict[str, Any]:
        run = self._run(job, "resume", (RunState.PAUSED,))
        with writing(self.sessions) as session:
            self._change(session, run, "resume", RunState.RUNNING)
            resumed = self._move(session, run.job, S.PAUSED, S.PENDING)
            self._due_now(session, run.job)
            record(session, run.id, run.job, "resume", actor)
        report = self._after(run, RunState.RUNNING, resumed=resumed)
        return self._dispatched(report, self.kick_quietly(run.job))

    @settled
    def cancel(self, job: str, actor: str) -> dict[str, Any]:
        return self._halt(job, "cancel", RunState.LIVE, RunState.CANCELLED, actor)

    def _halt(self, job: str, verb: str, allowed: tuple[str, ...], to: str,
              actor: str) -> dict[str, Any]:
        """Pause or cancel: the run moves to `to`, pending partitions are parked at once and
        running ones by their holders at the next batch (or here, if nobody holds them)."""
        run = self._run(job, verb, allowed)
        with writing(self.sessions) as session:
            self._change(session, run, verb, to)
            parked = self._move(session, run.job, S.PENDING, S.PAUSED)
            record(session, run.id, run.job, verb, actor)
        report = self._after(run, to, parked=parked)
        try:
            report["parked"] += self._park(run)
        except (RedisError, OSError) as exc:  # every reconcile round parks them too
            report["deferred"] = _deferred("parking idle partitions", exc)
        return report

    @settled
    def retry_failed(self, job: str, actor: str) -> dict[str, Any]:
        run = self._run(job, "retry-failed", (*RunState.LIVE, RunState.FAILED))
        to = S.PAUSED if run.state == RunState.PAUSED else S.PENDING
        with writing(self.sessions) as session:
            retried = self._move(session, run.job, S.FAILED, to, error=None, crashes=0,
                                 finished_at=None)
            if not retried:
                raise ControlRefused(f"retry-failed {run.job}: run {run.shown} has no failed "
                                     "partitions")
            if run.state == RunState.FAILED:
                self._change(session, run, "retry-failed", RunState.RUNNING)
            if to == S.PENDING:
                self._due_now(session, run.job)
            record(session, run.id, run.job, "retry-failed", actor, f"partitions={retried}")
        state = RunState.PAUSED if to == S.PAUSED else RunState.RUNNING
        report = self._after(run, state, retried=retried)
        if to == S.PENDING:
            return self._dispatched(report, self.kick_quietly(run.job))
        return report

    def retry_skipped(self, job: str, actor: str) -> dict[str, Any]:
        """Rows the latest run quarantined run again, once each (`tasks.ranges.retries`)."""
        name = get_job(job).name
        report = retry_rows(self.sessions, name, actor)
        report = self._copy_flags(name, report)
        if report["state"] == RunState.RUNNING:
            return self._dispatched(report, self.kick_quietly(name))
        return report

    @settled
    def throttle(self, job: str, rows_per_s: object, actor: str) -> dict[str, Any]:
        rate = validate_rate(rows_per_s)
        run = self._run(job, "throttle", RunState.LIVE)
        with writing(self.sessions) as session:
            self._change(session, run, "throttle", run.state, rows_per_s=rate)
            record(session, run.id, run.job, "throttle", actor, f"rows_per_s={rate:g}")
        return self._after(run, run.state, rows_per_s=rate)

    def _run(self, job: str, verb: str, allowed: tuple[str, ...]) -> Run:
        """The job's latest run, if its state allows `verb`; `ControlRefused` otherwise."""
        name = get_job(job).name
        run = current_run(self.sessions, name)
        if run is None:
            raise ControlRefused(f"{verb} {name}: the job has no run; start it first "
                                 "(tasks.ranges.start)")
        if run.state not in allowed:
            raise ControlRefused(f"{verb} {name}: run {run.shown} is {run.state} (allowed when "
                                 f"{' or '.join(allowed)})")
        return run

    @staticmethod
    def _change(session: Session, run: Run, verb: str, to: str, **values: Any) -> None:
        if not change_state(session, run, to, **values):
            now = session.execute(select(RANGE_RUNS.c.state).where(
                RANGE_RUNS.c.id == run.id)).scalar()
            raise RunChanged(f"{verb} {run.job}: run {run.shown} changed from {run.state} to "
                             f"{now} while this control ran; nothing was changed, try again")

    @staticmethod
    def _move(session: Session, job: str, old: str, new: str, **values: Any) -> int:
        """Partitions of `job` in state `old` -> `new` (how many)."""
        return affected(session.execute(update(WORK).where(
            partitions_of(job), WORK.c.status == old)
            .values(status=new, dispatched_at=None, **values)))

    @staticmethod
    def _due_now(session: Session, job: str) -> None:
        """The job's reconcile round is due at once (and beat reconciles it again)."""
        session.execute(update(SCHEDULES).where(SCHEDULES.c.name == range_schedule_name(job))
                        .values(next_run_at=utcnow(), active=True))

    def _park(self, run: Run) -> int:
        return park_unleased(self.sessions, self.client, run.job)

    def _after(self, run: Run, state: str, **report: Any) -> dict[str, Any]:
        """Copy the run's new state to Redis; the control's report."""
        return self._copy_flags(run.job, {"job": run.job, "run": run.shown, "state": state,
                                          **report})

    def _copy_flags(self, job: str, report: dict[str, Any]) -> dict[str, Any]:
        """The control is committed; copying its state to the runners' Redis hash is the
        second step. If Redis is away, every reconcile round copies it again (before it
        dispatches anything), so the control still holds: the report says it is deferred."""
        try:
            write_flags(self.client, current_run(self.sessions, job))
        except (RedisError, OSError) as exc:
            report["deferred"] = _deferred("copying the run's state to Redis", exc)
        return report

    @staticmethod
    def _dispatched(report: dict[str, Any], kicked: dict[str, Any]) -> dict[str, Any]:
        report["dispatched"] = kicked.get("dispatched", [])
        if "deferred" in kicked:
            report["deferred"] = kicked["deferred"]
        return report

    def kick_quietly(self, job: str) -> dict[str, Any]:
        """One reconcile round now (what the control set pending is dispatched at once);
        if Redis or the database is away, beat's next round does it instead."""
        try:
            return self.kick(job)
        except (RedisError, OSError, OperationalError) as exc:
            return {"deferred": _deferred("the reconcile round", exc)}


def _then(then: Then | None, session: Session, job: str, run_id: int) -> None:
    if then is not None and not then(session, run_id):
        raise Overtaken(f"start {job}: overtaken (its due time was fired elsewhere); "
                        "nothing was changed")


# MySQL/MariaDB error codes of a statement the job's table cannot answer (PyMySQL raises the
# first as OperationalError): no such column, no such table.
_REFUSED_CODES = (1054, 1146)


def _refusal(exc: DBAPIError) -> bool:
    """The job's table cannot be read as the job declares it (not an outage)."""
    if isinstance(exc, ProgrammingError) or "no such" in str(exc.orig):
        return True
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return bool(args) and args[0] in _REFUSED_CODES


def _deferred(what: str, exc: BaseException) -> str:
    return (f"{what} is left to the reconciler ({type(exc).__name__}: "
            f"{str(exc)[:160]})")
