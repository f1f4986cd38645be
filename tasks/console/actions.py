"""Every call the console makes into the platform, in one place.

The console shows and does what the CLI shows and does, with the same code: the range-job
controls are `tasks.ranges.tasks.controls()` / `start_job` (what `python -m tasks jobs ...`
and the `tasks.ranges.*` Celery tasks run), the status views are the plain views of
`tasks.ranges.status`, `tasks.ranges.runs` and `tasks.restock.status` (what `python -m tasks
status` draws), serialised as `status --json` serialises them, the dead letters are
`tasks.deadletters.store.DeadLetters` and `tasks.deadletters.view` (what `python -m tasks
deadletters ...` runs). It imports no CLI module.
If one of those functions is renamed, this module is the one to change.

Every function here is blocking (database and Redis round trips): the web handlers run them
on a thread pool. Each returns plain JSON-able values. A refusal (unknown job, bad rate, a run
in no state for the verb, a letter that cannot be replayed) raises `Refused` with the
platform's own message; nothing was changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tasks.celery import app, settings
from tasks.config.settings import redact
from tasks.store.resources import Resources, resources_for

if TYPE_CHECKING:
    from tasks.ranges.paging import PartitionQuery
    from tasks.ranges.status import JobSummary

__all__ = ["Refused", "Unavailable", "BadRequest", "VERBS", "load_jobs", "jobs_overview",
           "partition_filters", "partition_query", "job_detail",
           "control", "restock_overview", "letters", "letter", "replay", "purge",
           "purge_older", "flower_link"]

# The buttons of a job: verb -> what it needs besides the job (throttle takes rows/s).
VERBS = ("start", "pause", "resume", "cancel", "retry-failed", "retry-skipped", "throttle")


class Refused(Exception):
    """The platform refused the request, having changed nothing; the message says why."""


class Unavailable(Exception):
    """Redis, the database or the broker did not answer; nothing was changed."""


class BadRequest(Exception):
    """A request's values name nothing the platform can answer (a filter or page that does not
    exist); nothing was read. The message says which value and what is accepted."""


def _res() -> Resources:
    return resources_for(settings)


def load_jobs() -> None:
    """Register the jobs a worker knows (the app's task modules, EXTRA_TASK_MODULES too), as
    the CLI's `jobs` commands do."""
    app.loader.import_default_modules()


def _guarded(call: Callable[[], Any]) -> Any:
    """Run `call`, turning the platform's refusals and outages into `Refused`/`Unavailable`."""
    from redis.exceptions import RedisError
    from sqlalchemy.exc import OperationalError

    import tasks.celery  # noqa: F401  (the app registers every wing's dead-letter kinds)
    from tasks.deadletters.store import DeadLetterError
    from tasks.deadletters.view import with_hint
    from tasks.store.validate import InvalidArguments

    try:
        return call()
    except (InvalidArguments, DeadLetterError) as exc:
        raise Refused(with_hint(exc)) from None
    except (RedisError, OperationalError, OSError) as exc:
        reason = redact(" ".join(str(exc).split()))[:300]
        raise Unavailable(f"{type(exc).__name__}: {reason}") from None


# -- range jobs ------------------------------------------------------------------------------

def jobs_overview() -> list[dict[str, Any]]:
    """One entry per registered range job: its run state, progress, rows/s, ETA, throttle."""
    return _guarded(_jobs_overview)  # type: ignore[no-any-return]


def _jobs_overview() -> list[dict[str, Any]]:
    from tasks.ranges.jobs import registered_jobs
    from tasks.ranges.status import JobSummary, job_summaries

    summaries = {s.job: s for s in job_summaries(_res().sessions)}
    return [_summary_json(summaries.get(job.name) or JobSummary.never_started(job.name))
            for job in registered_jobs()]


def _summary_json(s: JobSummary) -> dict[str, Any]:
    """A `JobSummary` as the page reads it: its `status --json` fields, the share walked, the
    ETA as text, rows/s to one decimal."""
    return {**s.as_dict(), "share": s.share, "rows_per_s": round(s.rows_per_s, 1),
            "eta": s.eta}


def partition_filters() -> tuple[str, ...]:
    """The job page's filter links: all (""), each partition state, and the slowest."""
    from tasks.ranges.paging import STATES

    return ("", *STATES, "slowest")


def partition_query(states: list[str], owner: str | None, slowest: str, limit: str | None,
                    after: str | None) -> PartitionQuery:
    """A page of a job's partitions from the job page's query string (`python -m tasks
    status`'s flags); `BadRequest` when a value names no page."""
    from tasks.ranges.paging import InvalidPage, PartitionQuery

    try:
        return PartitionQuery.parse(None, states, owner, slowest, limit, after)
    except InvalidPage as exc:
        raise BadRequest(str(exc)) from None


def job_detail(job: str, query: PartitionQuery) -> dict[str, Any]:
    """A job's summary with its totals per partition state, one page of its partitions (the
    page `query` asks for; its job is this one) and its run history (newest first)."""
    return _guarded(lambda: _job_detail(job, query))  # type: ignore[no-any-return]


def _job_detail(job: str, query: PartitionQuery) -> dict[str, Any]:
    from dataclasses import replace

    from tasks.ranges.jobs import get_job
    from tasks.ranges.paging import partition_page
    from tasks.ranges.runs import events_of, runs_of
    from tasks.ranges.status import JobSummary, job_summaries

    declared = get_job(job)
    name = declared.name
    sessions = _res().sessions
    summary = next(iter(job_summaries(sessions, name)), None) or JobSummary.never_started(name)
    page = partition_page(sessions, replace(query, job=name))
    parts = [{**v.as_dict(), "share": v.share, "rows_per_s": round(v.rows_per_s, 1)}
             for v in page.partitions]
    found = runs_of(sessions, name, 20)
    events = events_of(sessions, [r.id for r in found])
    runs = [{**r.as_dict(), "events": [e.as_dict() for e in events[r.id]]} for r in found]
    return {"job": _summary_json(summary), "partitions": parts, "page": page.as_dict(),
            "runs": runs, "param_fields": param_fields(declared),
            "schedule": _schedule_of(declared)}


def control(verb: str, job: str, actor: str, rows_per_s: str | None = None,
            params: Sequence[str] = ()) -> dict[str, Any]:
    """Run one of VERBS on `job`, as `python -m tasks jobs VERB JOB` does; its report. `params`:
    a start's run parameters as `NAME=VALUE` (`jobs start --param`), checked before anything
    is written."""
    from tasks.ranges.params import parse_pairs
    from tasks.ranges.tasks import controls, start_job

    if verb not in VERBS:
        raise Refused(f"unknown control {verb!r} (known: {', '.join(VERBS)})")

    def run() -> dict[str, Any]:
        if verb == "start":
            return start_job(job, actor, parse_pairs(params) if params else None)
        c = controls()
        if verb == "throttle":
            return c.throttle(job, rows_per_s if rows_per_s is not None else "", actor)
        verbs: dict[str, Callable[[str, str], dict[str, Any]]] = {
            "pause": c.pause, "resume": c.resume, "cancel": c.cancel,
            "retry-failed": c.retry_failed, "retry-skipped": c.retry_skipped}
        return verbs[verb](job, actor)

    return _guarded(run)  # type: ignore[no-any-return]


def dry_run(job: str, params: Sequence[str] = ()) -> dict[str, Any]:
    """What starting `job` with `params` (`NAME=VALUE`) would do, as `jobs start --dry-run`:
    the plan, the first batch's SQL and rows, an ETA; reads only."""
    from tasks.ranges.dryrun import dry_run as plan
    from tasks.ranges.jobs import get_job
    from tasks.ranges.params import parse_pairs, values_of

    def run() -> dict[str, Any]:
        found = get_job(job)
        given, stored = found.make_params(parse_pairs(params) if params else None)
        return plan(_res().sessions, found, given, values_of(stored)).as_dict()

    return _guarded(run)  # type: ignore[no-any-return]


def schedule(job: str, actor: str, cron: str | None, policy: str, missed: str) -> dict[str, Any]:
    """Set or change (`cron` given) or clear (`cron` None) `job`'s cron schedule, as `python
    -m tasks jobs schedule` does; the schedule as stored."""
    from tasks.ranges.jobs import get_job
    from tasks.ranges.timetable import clear_schedule, set_schedule

    def run() -> dict[str, Any]:
        found = get_job(job)
        if cron is None:
            clear_schedule(_res().sessions, found)
        else:
            set_schedule(_res().sessions, found, cron, policy or "skip", missed or "once")
        return _schedule_of(found) or {"job": found.name, "cron": None}

    return _guarded(run)  # type: ignore[no-any-return]


def _schedule_of(job: Any) -> dict[str, Any] | None:
    from tasks.ranges.timetable import views

    return next((v for v in views(_res().sessions, [job]) if v["job"] == job.name), None)


def param_fields(job: Any) -> list[dict[str, Any]]:
    """The run parameters `job` declares, as the start form shows them."""
    from tasks.ranges.params import fields_of

    if job.params is None:
        return []
    return [{"name": f.name, "type": f.kind.__name__, "required": f.required}
            for f in fields_of(job.params)]


# -- restock ---------------------------------------------------------------------------------

def restock_overview() -> list[dict[str, Any]]:
    """Every stock shard: term, maintenance window, queues, due entries, unsynced log, dead
    letters (what `python -m tasks status` shows)."""
    from tasks.restock.clock import wall_ms
    from tasks.restock.settings import restock_settings
    from tasks.restock.shards import stock_shards
    from tasks.restock.status import shard_views, shards_json

    def read() -> list[dict[str, Any]]:
        res = _res()
        now = wall_ms()
        queues = restock_settings(res.settings).queue_names
        views = shard_views(res.sessions, stock_shards(res), queues, now)
        return shards_json(views, now)

    return _guarded(read)  # type: ignore[no-any-return]


# -- dead letters ----------------------------------------------------------------------------

def letters(kind: str | None, limit: int = 100) -> dict[str, Any]:
    """The newest `limit` letters (of `kind`), without payloads, and the count per kind."""
    from tasks.deadletters.store import DeadLetters
    from tasks.deadletters.view import summary_dict

    def read() -> dict[str, Any]:
        store = DeadLetters(_res().sessions)
        return {"counts": store.counts(),
                "letters": [summary_dict(s, "seconds") for s in store.recent(limit, kind or None)]}

    return _guarded(read)  # type: ignore[no-any-return]


def letter(letter_id: int) -> dict[str, Any]:
    """One letter with its payload, credentials hidden (as `deadletters show --json`)."""
    from tasks.deadletters.store import DeadLetters, replay_refusal
    from tasks.deadletters.view import letter_facts, shown_payload

    def read() -> dict[str, Any]:
        found = DeadLetters(_res().sessions).get(letter_id)
        _, text, _ = shown_payload(found)
        return {**letter_facts(found, "seconds"),
                "refusal": replay_refusal(found.payload, found.kind), "payload": text}

    return _guarded(read)  # type: ignore[no-any-return]


def replay(letter_id: int) -> dict[str, Any]:
    """Send the letter's task again under a new task id (once per letter), as `deadletters
    replay` does."""
    from tasks.deadletters.store import DeadLetterError, DeadLetters
    from tasks.deadletters.view import SEND_RETRY

    def send(name: str, args: list[Any], kwargs: dict[str, Any], task_id: str) -> None:
        app.send_task(name, args=args, kwargs=kwargs, task_id=task_id, serializer="json",
                      retry_policy=SEND_RETRY)

    def run() -> dict[str, Any]:
        try:
            done = DeadLetters(_res().sessions).replay(letter_id, send)
        except DeadLetterError:
            raise
        except Exception as exc:  # the broker is away: the store took its claim back
            reason = redact(" ".join(str(exc).split()))[:300]
            raise Unavailable(f"dead letter {letter_id}: its task could not be sent "
                              f"({type(exc).__name__}: {reason}); the letter is unchanged"
                              ) from None
        return {"id": done.letter_id, "task": done.task, "task_id": done.task_id,
                "note": done.note}

    return _guarded(run)  # type: ignore[no-any-return]


def purge(letter_id: int) -> dict[str, Any]:
    """Delete one letter (`deadletters purge ID`)."""
    from tasks.deadletters.store import DeadLetters

    _guarded(lambda: DeadLetters(_res().sessions).purge(letter_id))
    return {"purged": letter_id}


def purge_older(duration: str) -> dict[str, Any]:
    """Delete every letter older than `duration` (`7d`, `12h`...; `deadletters purge
    --older-than`)."""
    from tasks.config.envparse import parse_duration
    from tasks.deadletters.store import DeadLetters

    try:
        seconds = parse_duration(duration)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    gone = _guarded(lambda: DeadLetters(_res().sessions).prune(seconds))
    return {"purged": gone, "older_than": duration}


def flower_link() -> str | None:
    """FLOWER_URL without its user and password (the console never shows a credential; the
    browser asks Flower's basic auth itself)."""
    from urllib.parse import urlsplit, urlunsplit

    if not settings.flower_url:
        return None
    parts = urlsplit(settings.flower_url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def job_known(job: str) -> bool:
    """Whether `job` names a registered range job (else the console's job pages are 404)."""
    from tasks.ranges.jobs import get_job
    from tasks.store.validate import InvalidArguments

    try:
        get_job(job)
    except InvalidArguments:
        return False
    return True
