"""`python -m tasks migrate | status`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from tasks.cli.common import open_resources, require_redis, require_tables

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from tasks.store.resources import Resources

__all__ = ["migrate", "status"]


@click.command()
def migrate() -> None:
    """Apply the schema migrations to DATABASE_URL."""
    from tasks.store.migrate import upgrade

    with open_resources(need_file=False) as res:
        upgrade(res.engine)
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
    from tasks.deadletters.view import console_for

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
        _watch(console, lambda: _snapshot(res, job, console.width), watch)


def _views(res: Resources, job: str | None) -> tuple[Any, Any, Any, int]:
    from tasks.deadletters.view import letters_view
    from tasks.ranges.status import partitions, summarize
    from tasks.restock.clock import wall_ms
    from tasks.restock.nodes import stock_nodes
    from tasks.restock.status import restock_nodes

    views = partitions(res.sessions, job)
    now = wall_ms()
    nodes = restock_nodes(res.sessions, stock_nodes(res), res.settings.restock_queue_names, now)
    return (views, summarize(views, res.sessions), (nodes, letters_view(res.sessions)), now)


def _snapshot(res: Resources, job: str | None, width: int) -> RenderableType:
    from rich.console import Group

    from tasks.deadletters.view import letters_renderable
    from tasks.ranges.status import jobs_table, partitions_table
    from tasks.restock.status import nodes_table

    views, summaries, (nodes, letters), now = _views(res, job)
    parts = [jobs_table(summaries)] if summaries else []
    return Group(*parts, partitions_table(views, width, job), nodes_table(nodes, now),
                 letters_renderable(letters))


def _snapshot_json(res: Resources, job: str | None) -> dict[str, Any]:
    from tasks.deadletters.view import letters_json
    from tasks.ranges.status import ranges_json
    from tasks.restock.status import nodes_json

    views, summaries, (nodes, letters), now = _views(res, job)
    return {**ranges_json(views, summaries), "restock_nodes": nodes_json(nodes, now),
            "dead_letters": letters_json(letters)}


def _watch(console: Console, snapshot: Callable[[], RenderableType], every: float) -> None:
    """Redraw `snapshot()` every `every` seconds in place until Ctrl-C; piped, print one
    snapshot after another (a live display would only show the last)."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from tasks.store.db import utcnow

    def stamped() -> RenderableType:
        return Group(Text(f"status at {utcnow():%Y-%m-%d %H:%M:%S} UTC, every {every:g}s "
                          "(Ctrl-C to stop)"), snapshot())

    try:
        if not console.is_terminal:
            while True:
                console.print(stamped())
                time.sleep(every)
        with Live(stamped(), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(every)
                live.update(stamped(), refresh=True)
    except KeyboardInterrupt:
        pass
