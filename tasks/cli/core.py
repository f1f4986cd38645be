"""`python -m tasks migrate | status`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from tasks.cli.common import load_jobs, open_resources, require_redis, require_tables

if TYPE_CHECKING:
    from tasks.cli.render import RenderableType
    from tasks.ranges.paging import PartitionQuery
    from tasks.store.resources import Resources

__all__ = ["migrate", "status"]


@click.command()
def migrate() -> None:
    """Apply the schema migrations to DATABASE_URL."""
    from tasks.store.migrate import upgrade
    from tasks.wings import load_tables

    with open_resources(need_file=False) as res:
        applied = upgrade(res.engine, metadata=load_tables(),
                          schema=res.settings.database_schema)
    for revision, doc in applied:
        click.echo(f"applied {revision}: {doc}")
    click.echo(f"schema is up to date ({len(applied)} migration"
               f"{'' if len(applied) == 1 else 's'} applied)")


# `status`'s sections, in the order it prints them (`--section`).
SECTIONS = ("ranges", "restock", "letters", "queues")
# The sections that are a wing's (shown only while the wing of that name is on).
WING_SECTIONS = ("ranges", "restock")


@click.command()
@click.option("--job", default=None, help="only this range job (and, unless --section says "
              "otherwise, only the range section)")
@click.option("--state", "states", multiple=True, metavar="STATE",
              help="only partitions in STATE (running, pending, failed, paused, done, empty;"
                   " repeat or comma-separate for several)")
@click.option("--owner", default=None, help="only partitions whose owner starts with OWNER "
              "(a worker's name: all its pool processes)")
@click.option("--slowest", is_flag=True, help="running partitions, lowest rows/s first")
@click.option("--limit", default=None, metavar="N",
              help="partitions per page (default 50, at most 500)")
@click.option("--after", default=None, metavar="CURSOR",
              help="the page after CURSOR (the `next` a page names; JOB:PART, or an offset "
                   "with --slowest)")
@click.option("--section", "sections", multiple=True, metavar="SECTION",
              help=f"only these sections ({', '.join(SECTIONS)}; repeat or comma-separate); "
                   "default all, or ranges alone with a range filter")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON envelope of kind status: jobs, a page of partitions, restock "
                   "nodes, dead letters, queues")
@click.option("--watch", type=click.FloatRange(min=0.2), is_flag=False, flag_value=2.0,
              default=None, metavar="[SECONDS]",
              help="refresh every SECONDS (default 2) until Ctrl-C")
def status(job: str | None, states: tuple[str, ...], owner: str | None, slowest: bool,
           limit: str | None, after: str | None, sections: tuple[str, ...], as_json: bool,
           watch: float | None) -> None:
    """Range jobs (totals per partition state) and one page of their partitions, restock nodes,
    dead letters and queue backlogs.

    Exits 1 with one line on stderr when a filter or cursor is not valid, or when the
    database or REDIS_URL does not answer (the compose and k8s readiness probes run
    `status --json`)."""
    from tasks.cli.common import emit, fail
    from tasks.cli.render import console_for
    from tasks.cli.render import watch as redraw
    from tasks.ranges.paging import InvalidPage, PartitionQuery

    if as_json and watch is not None:
        raise click.UsageError("--json and --watch do not go together: poll --json instead")
    try:
        query = PartitionQuery.parse(job, states, owner, slowest, limit, after)
    except InvalidPage as exc:
        fail(f"status: {exc}")
    shown = _sections(sections, query)
    load_jobs()  # a bad EXTRA_TASK_MODULES is reported here as in `jobs`, not ignored
    with open_resources() as res:
        require_tables(res)
        require_redis(res)
        if as_json:
            emit("status", item=_snapshot_json(res, query, shown))
            return
        console = console_for()
        if watch is None:
            console.print(_snapshot(res, query, shown, console.width))
            return
        redraw(console, lambda: _snapshot(res, query, shown, console.width), watch)


def _sections(given: tuple[str, ...], query: PartitionQuery) -> tuple[str, ...]:
    """The sections `status` shows: those named, else every one, else (with a range filter)
    the range section alone. An unknown name ends the command with one line."""
    from tasks.cli.common import fail
    from tasks.wings import is_enabled

    named = [s.strip() for item in given for s in item.split(",") if s.strip()]
    unknown = [s for s in named if s not in SECTIONS]
    if unknown:
        fail(f"status: --section {unknown[0][:40]!r} is not one of {', '.join(SECTIONS)}")
    # A wing that is off (WINGS) has no section: its tables may not exist.
    off = [s for s in WING_SECTIONS if not is_enabled(s)]
    if off and set(off) & set(named or ()):
        fail(f"status: the {off[0]} wing is off (WINGS), so it has no section to show")
    if query.job is not None or query.filtered:
        if "ranges" in off:
            fail("status: the ranges wing is off (WINGS): no range job to filter")
        named = named or ["ranges"]
    return tuple(s for s in SECTIONS if (s in named if named else s not in off))


def _views(res: Resources, query: PartitionQuery, shown: tuple[str, ...]) -> dict[str, Any]:
    """What each shown section reads (nothing for the others)."""
    from tasks.restock.clock import wall_ms

    views: dict[str, Any] = {"now": wall_ms()}
    if "ranges" in shown:
        from tasks.ranges.paging import partition_page
        from tasks.ranges.status import job_summaries

        views["ranges"] = (partition_page(res.sessions, query),
                           job_summaries(res.sessions, query.job))
    if "restock" in shown:
        from tasks.restock.settings import restock_settings
        from tasks.restock.shards import stock_shards
        from tasks.restock.status import shard_views

        queues = restock_settings(res.settings).queue_names
        views["restock"] = shard_views(res.sessions, stock_shards(res), queues, views["now"])
    if "letters" in shown:
        from tasks.deadletters.view import letters_view

        views["letters"] = letters_view(res.sessions)
    if "queues" in shown:
        views["queues"] = _backlog()
    return views


def _snapshot(res: Resources, query: PartitionQuery, shown: tuple[str, ...],
              width: int) -> RenderableType:
    from tasks.cli.render import status_renderable

    return status_renderable(_views(res, query, shown), width)


def _backlog() -> list[dict[str, Any]] | None:
    """Each platform queue's backlog on the broker (None: the broker does not answer)."""
    from kombu.exceptions import OperationalError as BrokerError
    from redis.exceptions import RedisError

    from tasks.celery import WINGS, app, settings
    from tasks.worker.backlog import queue_backlog
    from tasks.worker.queues import queue_names

    try:
        return [b.as_dict() for b in queue_backlog(app, queue_names(settings, WINGS))]
    except (BrokerError, RedisError, OSError):
        return None


def _snapshot_json(res: Resources, query: PartitionQuery,
                   shown: tuple[str, ...]) -> dict[str, Any]:
    """The item of `status --json`: the shown sections' keys (jobs, partitions and page;
    restock_nodes; dead_letters; queues) and `sections`, naming them."""
    from tasks.deadletters.view import letters_json
    from tasks.ranges.paging import ranges_json
    from tasks.restock.status import shards_json

    views = _views(res, query, shown)
    item: dict[str, Any] = {"sections": list(shown)}
    if "ranges" in views:
        page, summaries = views["ranges"]
        item.update(ranges_json(summaries, page))
    if "restock" in views:
        item["restock_nodes"] = shards_json(views["restock"], views["now"])
    if "letters" in views:
        item["dead_letters"] = letters_json(views["letters"])
    if "queues" in views:
        item["queues"] = views["queues"]
    return item
