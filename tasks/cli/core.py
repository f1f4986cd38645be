"""`python -m tasks migrate | status`."""

from __future__ import annotations

import json
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


@click.command()
@click.option("--job", default=None, help="only this range job's partitions")
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
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object: jobs, a page of partitions, restock nodes, dead letters")
@click.option("--watch", type=click.FloatRange(min=0.2), is_flag=False, flag_value=2.0,
              default=None, metavar="[SECONDS]",
              help="refresh every SECONDS (default 2) until Ctrl-C")
def status(job: str | None, states: tuple[str, ...], owner: str | None, slowest: bool,
           limit: str | None, after: str | None, as_json: bool, watch: float | None) -> None:
    """Range jobs (totals per partition state) and one page of their partitions, restock nodes
    and dead letters.

    Exits 1 with one line on stderr when a filter or cursor is not valid, or when the
    database or REDIS_URL does not answer (the compose and k8s readiness probes run
    `status --json`)."""
    from tasks.cli.common import fail
    from tasks.cli.render import console_for
    from tasks.cli.render import watch as redraw
    from tasks.ranges.paging import InvalidPage, PartitionQuery

    if as_json and watch is not None:
        raise click.UsageError("--json and --watch do not go together: poll --json instead")
    try:
        query = PartitionQuery.parse(job, states, owner, slowest, limit, after)
    except InvalidPage as exc:
        fail(f"status: {exc}")
    load_jobs()  # a bad EXTRA_TASK_MODULES is reported here as in `jobs`, not ignored
    with open_resources() as res:
        require_tables(res)
        require_redis(res)
        if as_json:
            click.echo(json.dumps(_snapshot_json(res, query), sort_keys=True, default=str))
            return
        console = console_for()
        if watch is None:
            console.print(_snapshot(res, query, console.width))
            return
        redraw(console, lambda: _snapshot(res, query, console.width), watch)


def _views(res: Resources, query: PartitionQuery) -> tuple[Any, Any, Any, int]:
    from tasks.deadletters.view import letters_view
    from tasks.ranges.paging import partition_page
    from tasks.ranges.status import job_summaries
    from tasks.restock.clock import wall_ms
    from tasks.restock.settings import restock_settings
    from tasks.restock.shards import stock_shards
    from tasks.restock.status import shard_views

    page = partition_page(res.sessions, query)
    now = wall_ms()
    queues = restock_settings(res.settings).queue_names
    nodes = shard_views(res.sessions, stock_shards(res), queues, now)
    return (page, job_summaries(res.sessions, query.job), (nodes, letters_view(res.sessions)),
            now)


def _snapshot(res: Resources, query: PartitionQuery, width: int) -> RenderableType:
    from tasks.cli.render import status_renderable, with_queues

    page, summaries, (nodes, letters), now = _views(res, query)
    return with_queues(status_renderable(page, summaries, nodes, letters, now, width),
                       _backlog())


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


def _snapshot_json(res: Resources, query: PartitionQuery) -> dict[str, Any]:
    from tasks.deadletters.view import letters_json
    from tasks.ranges.paging import ranges_json
    from tasks.restock.status import shards_json

    page, summaries, (nodes, letters), now = _views(res, query)
    return {**ranges_json(summaries, page), "restock_nodes": shards_json(nodes, now),
            "dead_letters": letters_json(letters), "queues": _backlog()}
