"""`python -m tasks migrate | status`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from tasks.cli.common import open_resources, require_redis, require_tables

if TYPE_CHECKING:
    from tasks.cli.render import RenderableType
    from tasks.store.resources import Resources

__all__ = ["migrate", "status"]


@click.command()
def migrate() -> None:
    """Apply the schema migrations to DATABASE_URL."""
    from tasks.store.migrate import upgrade
    from tasks.wings import load_tables

    with open_resources(need_file=False) as res:
        upgrade(res.engine, metadata=load_tables())
    click.echo("schema is up to date")


@click.command()
@click.option("--job", default=None, help="only this range job's partitions")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object: jobs, partitions, restock nodes, dead letters")
@click.option("--watch", type=click.FloatRange(min=0.2), is_flag=False, flag_value=2.0,
              default=None, metavar="[SECONDS]",
              help="refresh every SECONDS (default 2) until Ctrl-C")
def status(job: str | None, as_json: bool, watch: float | None) -> None:
    """Range jobs and partitions, restock nodes and dead letters.

    Exits 1 with one line on stderr when the database or REDIS_URL does not answer (the
    compose and k8s readiness probes run `status --json`)."""
    from tasks.cli.render import console_for
    from tasks.cli.render import watch as redraw

    if as_json and watch is not None:
        raise click.UsageError("--json and --watch do not go together: poll --json instead")
    with open_resources() as res:
        require_tables(res)
        require_redis(res)
        if as_json:
            click.echo(json.dumps(_snapshot_json(res, job), sort_keys=True, default=str))
            return
        console = console_for()
        if watch is None:
            console.print(_snapshot(res, job, console.width))
            return
        redraw(console, lambda: _snapshot(res, job, console.width), watch)


def _views(res: Resources, job: str | None) -> tuple[Any, Any, Any, int]:
    from tasks.deadletters.view import letters_view
    from tasks.ranges.status import partitions, summarize
    from tasks.restock.clock import wall_ms
    from tasks.restock.settings import restock_settings
    from tasks.restock.shards import stock_shards
    from tasks.restock.status import shard_views

    views = partitions(res.sessions, job)
    now = wall_ms()
    queues = restock_settings(res.settings).queue_names
    nodes = shard_views(res.sessions, stock_shards(res), queues, now)
    return (views, summarize(views, res.sessions), (nodes, letters_view(res.sessions)), now)


def _snapshot(res: Resources, job: str | None, width: int) -> RenderableType:
    from tasks.cli.render import status_renderable

    views, summaries, (nodes, letters), now = _views(res, job)
    return status_renderable(views, summaries, nodes, letters, now, width, job)


def _snapshot_json(res: Resources, job: str | None) -> dict[str, Any]:
    from tasks.deadletters.view import letters_json
    from tasks.ranges.status import ranges_json
    from tasks.restock.status import shards_json

    views, summaries, (nodes, letters), now = _views(res, job)
    return {**ranges_json(views, summaries), "restock_nodes": shards_json(nodes, now),
            "dead_letters": letters_json(letters)}
