"""`python -m tasks jobs start|pause|resume|cancel|retry-failed|retry-skipped|throttle|runs JOB`
and `python -m tasks jobs run JOB N` (one run in detail, with its failures' tracebacks).

`schedule JOB CRON [--policy] [--missed]`, `schedule JOB --clear` and `schedules` set, clear and
list the jobs' cron schedules (`tasks.ranges.timetable`).

`start` takes the run's parameters (`--param NAME=VALUE`, repeated), a CSV job's input
(`--csv PATH`, `tasks.ranges.collections`) and `--dry-run`, which prints what the start would
do and writes nothing (`tasks.ranges.dryrun`).

The controls are `tasks.ranges.controls.Controls`, the same code the Celery tasks
(`tasks.ranges.pause` ...) run; this module parses, prints, and turns a refusal (unknown job,
bad rate, a run in no state for the verb) into one line on stderr and exit code 1, having
changed nothing. Each control is recorded with `user@host` as the one who asked.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from tasks.cli.common import emit, fail, open_resources, require_tables
from tasks.cli.words import duration, pairs, when, when_iso, word

__all__ = ["jobs", "actor"]


def actor() -> str:
    """Who asks from this terminal: `user@host`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid (a container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@click.group()
def jobs() -> None:
    """Range-job controls (pause, resume, cancel, retry-failed, retry-skipped, throttle), run
    history and schedules."""
    from tasks.wings import is_enabled

    if not is_enabled("ranges"):
        fail("jobs: the ranges wing is off (WINGS), so there are no range jobs")


@contextmanager
def _refusals() -> Iterator[None]:
    """A refusal or an unreachable Redis ends the command with one line and exit code 1."""
    from redis.exceptions import RedisError

    from tasks.store.validate import InvalidArguments

    try:
        yield
    except InvalidArguments as exc:
        fail(str(exc))
    except (RedisError, OSError) as exc:
        fail(f"cannot reach Redis (REDIS_URL): {type(exc).__name__}: {str(exc)[:200]}")


def _control(verb: Callable[..., dict[str, Any]], *args: Any, as_json: bool = False) -> None:
    with open_resources() as res, _refusals():
        require_tables(res)
        report = verb(*args, actor())
    if as_json:
        emit("control", item=report)
        return
    shown = {k: v for k, v in report.items() if k not in ("job", "run", "state")
             and v not in (None, False, 0, [], {})}
    extra = "; ".join(f"{k.replace('_per_s', '/s').replace('_', ' ')} {word(v)}"
                      for k, v in shown.items())
    click.echo(f"{report['job']} run {report['run']}: {report.get('state', 'running')}"
               + (f" ({extra})" if extra else ""))


def _load_jobs() -> None:
    """Register the jobs a worker knows: import the app's task modules (EXTRA_TASK_MODULES
    included), as `celery -A tasks worker` does."""
    from tasks.celery import app

    app.loader.import_default_modules()


def _controls() -> Any:
    from tasks.ranges.tasks import controls

    _load_jobs()
    return controls()


@jobs.command()
@click.argument("job")
@click.option("--param", "pairs", multiple=True, metavar="NAME=VALUE",
              help="A run parameter of the job (repeat for each); checked before anything "
                   "is written.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan, the first batch's SQL and rows and an ETA; write nothing.")
@click.option("--csv", "csv_path", metavar="PATH",
              help="A CSV job's input: a header line, then one record per item; read and "
                   "checked whole before anything is written, stored with the run.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON envelope: kind control (kind dry_run with --dry-run).")
def start(job: str, pairs: tuple[str, ...], dry_run: bool, csv_path: str | None,
          as_json: bool) -> None:
    """Start JOB: a new run unless one is running (what tasks.ranges.start does)."""
    from tasks.ranges.collections import read_csv
    from tasks.ranges.jobs import get_job
    from tasks.ranges.params import parse_pairs
    from tasks.ranges.tasks import start_job

    _load_jobs()
    with _refusals():
        given = parse_pairs(pairs) if pairs else None
        get_job(job)
        if dry_run and csv_path is not None:
            fail("start --dry-run reads a table; a CSV job's rows are its input (check the "
                 "file with a start)")
        records = read_csv(csv_path) if csv_path is not None else None
    if dry_run:
        _dry_run(job, given, as_json)
        return
    _control(lambda j, who: start_job(j, who, given, records=records), job, as_json=as_json)


def _dry_run(job: str, given: dict[str, str] | None, as_json: bool) -> None:
    """`start --dry-run`: reads only (no Redis, no run, no lease, no work row)."""
    from tasks.cli.render import dry_run_lines, print_lines
    from tasks.ranges.dryrun import dry_run
    from tasks.ranges.jobs import get_job
    from tasks.ranges.params import values_of

    with open_resources() as res, _refusals():
        require_tables(res)
        found = get_job(job)
        params, stored = found.make_params(given)
        report = dry_run(res.sessions, found, params, values_of(stored))
    if as_json:
        emit("dry_run", item=report.as_dict())
        return
    print_lines(dry_run_lines(report.as_dict()))


@jobs.command()
@click.argument("job")
def pause(job: str) -> None:
    """Pause JOB: running partitions commit their batch, release their lease, are paused."""
    _control(_controls().pause, job)


@jobs.command()
@click.argument("job")
def resume(job: str) -> None:
    """Resume a paused JOB: its partitions are dispatched at once."""
    _control(_controls().resume, job)


@jobs.command()
@click.argument("job")
def cancel(job: str) -> None:
    """Cancel JOB's run; `start` afterwards begins a new run from the job's filter."""
    _control(_controls().cancel, job)


@jobs.command("retry-failed")
@click.argument("job")
def retry_failed(job: str) -> None:
    """Failed partitions of JOB go back to pending, keeping their checkpoints."""
    _control(_controls().retry_failed, job)


@jobs.command("retry-skipped")
@click.argument("job")
def retry_skipped(job: str) -> None:
    """The rows JOB's latest run quarantined (skip policy) run again, each once."""
    _control(_controls().retry_skipped, job)


@jobs.command(context_settings={"ignore_unknown_options": True})
@click.argument("job")
@click.argument("rows_per_s")
def throttle(job: str, rows_per_s: str) -> None:
    """Cap JOB at ROWS_PER_S rows per second over all its workers (0 lifts the cap)."""
    _control(lambda j, who: _controls().throttle(j, rows_per_s, who), job)


def _history(job: str, read: Callable[[Any, str], list[Any]]) -> tuple[str, list[Any], Any]:
    """The job's name, the runs `read` finds, and their events (by run id)."""
    from tasks.ranges.jobs import get_job
    from tasks.ranges.runs import events_of

    _load_jobs()
    with open_resources() as res, _refusals():
        require_tables(res)
        name = get_job(job).name
        found = read(res.sessions, name)
        return name, found, events_of(res.sessions, [r.id for r in found])


def _run_json(run: Any, events: list[Any]) -> dict[str, Any]:
    from tasks.ranges.failures import FAILED_VERB, failure_dict

    shown = [e.as_dict() for e in events]
    return {**run.as_dict(), "events": shown, "failures": [
        failure_dict(e["at"], e["actor"], e["detail"]) for e in shown
        if e["verb"] == FAILED_VERB]}


def _run_line(run: Any) -> str:
    from tasks.ranges.params import values_of

    d = run.as_dict()
    cap = f"{word(run.rows_per_s)} rows/s" if run.rows_per_s else "-"
    return (f"run {d['run']}  {run.state:<9}  started {when(run.started_at)} by "
            f"{run.started_by or '-'}  finished {when(run.finished_at)}  duration "
            f"{duration(d['duration_s'])}  rows {run.rows:,}  skipped {run.skipped:,}  "
            f"throttle {cap}" + (f"  params {pairs(values_of(run.params))}"
                                 if run.params else ""))


def _event_line(at: str | None, verb: str, actor: str, detail: str | None) -> str:
    first = detail.splitlines()[0] if detail else ""
    return f"    {when_iso(at)}  {verb:<12} by {actor}" + (f"  ({first})" if first else "")


@jobs.command()
@click.argument("job")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000),
              help="How many runs, newest first.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON envelope: kind run, the runs (with their events) as items.")
def runs(job: str, limit: int, as_json: bool) -> None:
    """The run history of JOB: each run's number, state, who started it, times and duration,
    rows, skipped rows, throttle, parameters, and who asked for what (a failed partition's
    error; `jobs run JOB N` shows its traceback)."""
    from tasks.cli.render import print_lines
    from tasks.ranges.failures import first_line
    from tasks.ranges.runs import runs_of

    name, found, events = _history(job, lambda s, n: runs_of(s, n, limit))
    if as_json:
        emit("run", items=[_run_json(r, events[r.id]) for r in found])
        return
    if not found:
        click.echo(f"{name}: no runs yet (start it: python -m tasks jobs start {name})")
        return
    lines = []
    for r in found:
        lines.append(_run_line(r))
        lines += [_event_line(e.as_dict()["at"], e.verb, e.actor, first_line(e.detail))
                  for e in events[r.id]]
    print_lines(lines)


@jobs.command("run")
@click.argument("job")
@click.argument("number", type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True,
              help="One JSON envelope: kind run, the run (events, failures) as its item.")
def run_detail(job: str, number: int, as_json: bool) -> None:
    """Run NUMBER of JOB in detail: its history line, its events, and each failed
    partition's error with its traceback."""
    from tasks.cli.render import print_lines
    from tasks.ranges.runs import run_numbered

    def read(sessions: Any, name: str) -> list[Any]:
        found = run_numbered(sessions, name, number)
        return [found] if found is not None else []

    name, found, events = _history(job, read)
    if not found:
        fail(f"{name} has no run {number} (python -m tasks jobs runs {name} lists its runs)")
    detail = _run_json(found[0], events[found[0].id])
    if as_json:
        emit("run", item=detail)
        return
    print_lines([_run_line(found[0]), *(_event_line(e["at"], e["verb"], e["actor"], e["detail"])
                                        for e in detail["events"])])
    for f in detail["failures"]:
        print_lines([f"part {f['part']} failed at {when_iso(f['at'])} on {f['by']}: "
                     f"{f['error']}"])
        for line in (f["traceback"] or "(no traceback kept)").splitlines():
            click.echo(f"    {line}")  # a traceback keeps its lines as Python wrote them


@jobs.command()
@click.argument("job")
@click.argument("cron", required=False)
@click.option("--policy", default="skip", show_default=True,
              help="While a run is live at a due time: skip it, replace the run (cancel it "
                   "and start anew), or queue one run for when it ends.")
@click.option("--missed", default="once", show_default=True,
              help="Due times missed while no beat ran: run once, or skip them.")
@click.option("--clear", is_flag=True, help="No more scheduled runs of JOB (until set again).")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON envelope: kind schedule, the schedule as its item.")
def schedule(job: str, cron: str | None, policy: str, missed: str, clear: bool,
             as_json: bool) -> None:
    """Set, change (JOB CRON), clear (JOB --clear) or show (JOB) JOB's cron schedule (UTC;
    six fields: seconds first). The leader beat starts its runs."""
    from tasks.ranges.jobs import get_job, registered_jobs
    from tasks.ranges.timetable import clear_schedule, set_schedule, views

    if clear and cron is not None:
        raise click.UsageError("give either CRON or --clear (not both)")
    _load_jobs()
    with open_resources() as res, _refusals():
        require_tables(res)
        found = get_job(job)
        if clear:
            clear_schedule(res.sessions, found)
        elif cron is not None:
            set_schedule(res.sessions, found, cron, policy, missed)
        shown = [v for v in views(res.sessions, registered_jobs()) if v["job"] == found.name]
    view = shown[0] if shown else {"job": found.name, "cron": None}
    if as_json:
        emit("schedule", item=view)
        return
    _print_schedules([view])


@jobs.command()
@click.option("--json", "as_json", is_flag=True,
              help="One JSON envelope: kind schedule, the schedules as items.")
def schedules(as_json: bool) -> None:
    """Every range job's cron schedule: policies, next due time, last fire."""
    from tasks.ranges.jobs import registered_jobs
    from tasks.ranges.timetable import views

    _load_jobs()
    with open_resources() as res, _refusals():
        require_tables(res)
        found = views(res.sessions, registered_jobs())
    if as_json:
        emit("schedule", items=found)
        return
    if not found:
        click.echo("no schedules (set one: python -m tasks jobs schedule JOB \"0 2 * * *\")")
    _print_schedules(found)


def _print_schedules(found: list[dict[str, Any]]) -> None:
    from tasks.cli.render import print_lines

    print_lines([_schedule_line(view) for view in found])


def _schedule_line(view: dict[str, Any]) -> str:
    if view.get("cron") is None:
        return f"{view['job']}: no schedule"
    line = (f"{view['job']}: \"{view['cron']}\" UTC  policy {view['policy']}  missed "
            f"{view['missed']}  next {when_iso(view['next_due'])}  ({view['source']})")
    if view.get("queued"):
        line += f"  queued {when_iso(view['queued'])}"
    if view.get("last_outcome"):
        line += (f"  last {when_iso(view['last_due'])}: {view['last_outcome']}  fired "
                 f"{word(view['fired'])}  skipped {word(view['skipped'])}")
    return line
