"""What the console's run page, queue view, dead-letter search and CSV upload call.

Like `tasks.console.actions` (whose `Refused` and `Unavailable` these raise too): blocking
calls into the platform's own functions, run by the handlers on a thread pool, returning
plain JSON-able values. The run page is what `python -m tasks jobs run JOB N` shows
(`tasks.ranges.runs`, `tasks.ranges.failures`, `tasks.ranges.retries.skipped_of`); the queue
view is `status`'s queues (`tasks.worker.backlog.queue_backlog`); the bulk actions are
`tasks.deadletters.bulk`; the upload is `jobs start JOB --csv PATH`'s checks and start
(`tasks.ranges.collections.parse_csv`, `tasks.ranges.tasks.start_job`). Every time is
written by `tasks.config.clock`: `iso` in the JSON, `shown` for the page to print.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tasks.celery import WINGS, app, settings
from tasks.config.clock import iso, shown
from tasks.config.settings import redact
from tasks.console.actions import Refused, Unavailable
from tasks.store.resources import Resources, resources_for

__all__ = ["NotFound", "MAX_UPLOAD_BYTES", "SKIPPED_SHOWN", "LETTERS_SHOWN", "BULK_ACTIONS",
           "known_job", "run_exists", "run_detail", "runs_list", "queues", "letters_found",
           "bulk_preview", "bulk", "start_with_csv"]

MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # an uploaded CSV's request body, at most
SKIPPED_SHOWN = 200  # skipped rows a run page lists (the rest are counted)
LETTERS_SHOWN = 100  # letters the dead-letter page lists (the rest are counted)
BULK_ACTIONS = ("replay", "purge")


class NotFound(Exception):
    """No such job, or no such run of it (the console answers 404)."""


def _res() -> Resources:
    return resources_for(settings)


def _guarded(call: Callable[[], Any]) -> Any:
    """Run `call`: an unknown job is `NotFound`, a refusal `Refused`, an outage
    `Unavailable`; nothing was changed by any of them."""
    from kombu.exceptions import OperationalError as BrokerError
    from redis.exceptions import RedisError
    from sqlalchemy.exc import OperationalError

    import tasks.celery  # noqa: F401  (the app registers every wing's dead-letter kinds)
    from tasks.deadletters.bulk import BadFilter, FilterChanged
    from tasks.deadletters.store import DeadLetterError
    from tasks.ranges.jobs import UnknownJob
    from tasks.store.validate import InvalidArguments

    try:
        return call()
    except UnknownJob as exc:
        raise NotFound(str(exc)) from None
    except (InvalidArguments, DeadLetterError, FilterChanged, BadFilter) as exc:
        raise Refused(str(exc)) from None
    except (RedisError, OperationalError, BrokerError, OSError) as exc:
        reason = redact(" ".join(str(exc).split()))[:300]
        raise Unavailable(f"{type(exc).__name__}: {reason}") from None


# -- runs ------------------------------------------------------------------------------------

def known_job(job: str) -> dict[str, Any]:
    """The job's name as registered, whether it takes a CSV, its run parameters;
    `NotFound` when no job has that name (the registry only: no I/O)."""
    from tasks.console.actions import param_fields
    from tasks.ranges.jobs import CSV_INPUT, get_job

    def read() -> dict[str, Any]:
        found = get_job(job)
        return {"job": found.name, "csv": found.input == CSV_INPUT,
                "param_fields": param_fields(found)}

    return _guarded(read)  # type: ignore[no-any-return]


def run_exists(job: str, number: int) -> None:
    """`NotFound` unless `job` is registered and has a run `number`."""
    run_detail(job, number, events=False)


def _run_json(run: Any) -> dict[str, Any]:
    """A run as `jobs runs --json` writes it, its times by `tasks.config.clock` (ISO with Z,
    and as people read them), its duration as text."""
    from tasks.ranges.status import format_eta

    return {**run.as_dict(), "started_at": iso(run.started_at),
            "finished_at": iso(run.finished_at), "started": shown(run.started_at),
            "finished": shown(run.finished_at), "duration": format_eta(run.duration_s())}


def run_detail(job: str, number: int, events: bool = True) -> dict[str, Any]:
    """Run `number` of `job`: its facts, its progress (while it is the job's live run), its
    events (who did what), its failed partitions with their tracebacks, its skipped rows."""
    from tasks.ranges.jobs import get_job
    from tasks.ranges.runs import run_numbered

    def read() -> dict[str, Any]:
        name = get_job(job).name
        found = run_numbered(_res().sessions, name, number)
        if found is None:
            raise NotFound(f"{name} has no run {number}")
        return _run_page(found) if events else _run_json(found)

    return _guarded(read)  # type: ignore[no-any-return]


def _run_page(run: Any) -> dict[str, Any]:
    from tasks.ranges.failures import FAILED_VERB, failure_dict
    from tasks.ranges.runs import events_of

    sessions = _res().sessions
    events = [{**e.as_dict(), "at": iso(e.at), "shown": shown(e.at)}
              for e in events_of(sessions, [run.id])[run.id]]
    failures = [{**failure_dict(e["at"], e["actor"], e["detail"]), "shown": e["shown"]}
                for e in events if e["verb"] == FAILED_VERB]
    return {**_run_json(run), "progress": _progress(run), "events": events,
            "failures": failures, "skipped_rows": _skipped_rows(run)}


def _progress(run: Any) -> dict[str, Any] | None:
    """The job's bar, rows/s and ETA while `run` is its live run (None: it ended)."""
    from tasks.ranges.status import job_summaries
    from tasks.ranges.tables import RunState

    if run.state not in RunState.LIVE:
        return None
    summary = next(iter(job_summaries(_res().sessions, run.job)), None)
    if summary is None or summary.run != run.shown:
        return None
    return {"share": summary.share, "rows_per_s": round(summary.rows_per_s, 1),
            "eta": summary.eta, "eta_s": summary.eta_s, "ids_walked": summary.ids_walked,
            "ids_planned": summary.ids_planned}


def _skipped_rows(run: Any) -> list[dict[str, Any]]:
    """The rows `run` quarantined and nobody retried yet: letter, row id, reason."""
    from tasks.deadletters.bulk import reasons_of
    from tasks.ranges.retries import skipped_of

    sessions = _res().sessions
    with sessions() as session:
        rows = skipped_of(session, run.job, run.id)[:SKIPPED_SHOWN]
    reasons = reasons_of(sessions, [r.letter for r in rows])
    return [{"letter": r.letter, "row_id": r.row_id, "reason": reasons.get(r.letter)}
            for r in rows]


def runs_list(job: str, limit: int = 50) -> dict[str, Any]:
    """The job's latest `limit` runs, newest first, without their events."""
    from tasks.ranges.jobs import get_job
    from tasks.ranges.runs import runs_of

    def read() -> dict[str, Any]:
        found = known_job(job)
        return {**found, "runs": [_run_json(r) for r in runs_of(
            _res().sessions, get_job(job).name, limit)]}

    return _guarded(read)  # type: ignore[no-any-return]


# -- queues ----------------------------------------------------------------------------------

def queues() -> list[dict[str, Any]]:
    """Every platform queue's backlog and its oldest message's age, as `status` shows them."""
    from tasks.ranges.status import format_eta
    from tasks.worker.backlog import queue_backlog
    from tasks.worker.queues import queue_names

    def read() -> list[dict[str, Any]]:
        return [{**b.as_dict(), "oldest": format_eta(b.oldest_s)}
                for b in queue_backlog(app, queue_names(settings, WINGS))]

    return _guarded(read)  # type: ignore[no-any-return]


# -- dead letters ----------------------------------------------------------------------------

def _filter(kind: str | None, search: str) -> Any:
    from tasks.deadletters.bulk import LetterFilter

    return _guarded(lambda: LetterFilter(kind or None, search))


def letters_found(kind: str | None, search: str) -> dict[str, Any]:
    """The letters of `kind` matching `search` (newest LETTERS_SHOWN), how many match, and
    the count per kind of every letter."""
    from tasks.deadletters.bulk import matching, preview
    from tasks.deadletters.store import DeadLetters

    found = _filter(kind, search)

    def read() -> dict[str, Any]:
        sessions = _res().sessions
        return {"counts": DeadLetters(sessions).counts(),
                "matching": preview(sessions, found).as_dict(),
                "letters": [{"id": s.id, "kind": s.kind, "ref": s.ref, "reason": s.reason,
                             "created_at": iso(s.created_at), "created": shown(s.created_at),
                             "replayed_at": iso(s.replayed_at),
                             "replay_task_id": s.replay_task_id}
                            for s in matching(sessions, found, LETTERS_SHOWN)]}

    return _guarded(read)  # type: ignore[no-any-return]


def bulk_preview(kind: str | None, search: str) -> dict[str, Any]:
    """What a bulk action on the filter would take: the count, how many are not replayed
    yet, the highest id (the action's `upto`), and the filter in words."""
    from tasks.deadletters.bulk import preview

    found = _filter(kind, search)
    counted = _guarded(lambda: preview(_res().sessions, found))
    return {**counted.as_dict(), "kind": found.kind, "search": found.search,
            "described": found.described()}


def bulk(action: str, kind: str | None, search: str, upto: str, expected: str
         ) -> dict[str, Any]:
    """Replay or purge every letter the filter matches up to `upto`, if `expected` still
    match (`tasks.deadletters.bulk`); what was done."""
    from tasks.deadletters.bulk import purge_matching, replay_matching

    if action not in BULK_ACTIONS:
        raise Refused(f"unknown bulk action {action!r} (known: {', '.join(BULK_ACTIONS)})")
    if not (upto.isdigit() and expected.isdigit()):
        raise Refused("a bulk action needs the count it confirmed (expected) and the highest "
                      "id it was shown (upto): ask for the count first")
    found = _filter(kind, search)
    top, count = int(upto), int(expected)
    sessions = _res().sessions
    if action == "purge":
        report = _guarded(lambda: purge_matching(sessions, found, top, count))
    else:
        report = _guarded(lambda: replay_matching(sessions, found, top, count, _send))
    return {"action": action, "described": found.described(), **report.as_dict()}


def _send(name: str, args: list[Any], kwargs: dict[str, Any], task_id: str) -> None:
    """A letter's task sent again (as `deadletters replay` and the letter page send it)."""
    from tasks.deadletters.view import SEND_RETRY

    app.send_task(name, args=args, kwargs=kwargs, task_id=task_id, serializer="json",
                  retry_policy=SEND_RETRY)


# -- CSV upload ------------------------------------------------------------------------------

def start_with_csv(job: str, actor: str, filename: str, data: bytes,
                   params: Sequence[str] = ()) -> dict[str, Any]:
    """Start a CSV job's run with an uploaded CSV as its input, as `jobs start JOB --csv PATH
    [--param NAME=VALUE]` does: the file checked whole first (a bad record refused naming its
    line, nothing written), then the run opened with its input in one transaction."""
    from tasks.ranges.collections import parse_csv
    from tasks.ranges.params import parse_pairs
    from tasks.ranges.tasks import start_job

    name = known_job(job)
    if not name["csv"]:
        raise Refused(f"{name['job']} is not a CSV job: it takes no upload")

    def run() -> dict[str, Any]:
        given = parse_pairs(params) if params else None
        records = parse_csv(data, filename or "upload.csv")
        return start_job(name["job"], actor, given, records=records)

    return _guarded(run)  # type: ignore[no-any-return]
