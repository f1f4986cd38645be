"""`python -m tasks migrate | seed | status`."""

from __future__ import annotations

import click

from tasks.cli.common import open_resources, require_tables

__all__ = ["migrate", "seed", "status"]


@click.command()
def migrate() -> None:
    """Apply the schema migrations to DATABASE_URL."""
    from tasks.migrate import upgrade

    with open_resources(need_file=False) as res:
        upgrade(res.engine)
    click.echo("schema is up to date")


@click.command()
@click.option("--rows", type=click.IntRange(min=0), default=1_000_000, show_default=True,
              help="rows to append")
def seed(rows: int) -> None:
    """Append rows to the demo table cm_data."""
    from tasks.examples.seed import seed_cm_data

    with open_resources(need_file=False) as res:
        first, last = seed_cm_data(res.engine, rows)
    click.echo(f"seeded ids {first}..{last}")


@click.command()
@click.option("--job", default=None, help="only this range job's partitions")
def status(job: str | None) -> None:
    """Range partitions, restock nodes and dead letters."""
    from tasks.ranges.status import partitions, render
    from tasks.restock.clock import wall_ms
    from tasks.restock.nodes import stock_nodes
    from tasks.restock.status import render_nodes, restock_nodes
    from tasks.status import render_letters

    with open_resources() as res:
        require_tables(res)
        render(partitions(res.sessions, job))
        now = wall_ms()
        render_nodes(restock_nodes(res.sessions, stock_nodes(res),
                                   res.settings.restock_queue_names, now), now)
        render_letters(res.sessions)
