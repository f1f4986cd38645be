"""`python -m tasks COMMAND`: migrate, seed, status. (The demo: `python -m devtools demo`.)"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.settings import redact

if TYPE_CHECKING:
    from tasks.resources import Resources

__all__ = ["main"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply the schema migrations to DATABASE_URL")
    seed = sub.add_parser("seed", help="append rows to the demo table cm_data")
    seed.add_argument("--rows", type=int, default=1_000_000)
    status = sub.add_parser("status", help="range partitions and restock nodes")
    status.add_argument("--job", default=None, help="only this range job's partitions")
    args = parser.parse_args(argv)

    from sqlalchemy.exc import OperationalError

    from tasks.app import settings
    from tasks.resources import resources_for

    if args.command == "status" and _missing_sqlite_file(settings.database_url):
        print(f"DATABASE_URL={redact(settings.database_url)}: the database file does not exist"
              ": run `python -m tasks migrate` to create it", file=sys.stderr)
        return 1
    res = resources_for(settings)
    try:
        return _run(args, parser, res)
    except OperationalError as exc:
        # A database that does not exist or does not answer: one clear line, no traceback.
        reason = str(exc.orig or exc).strip().splitlines()[0]
        print(f"cannot use DATABASE_URL={redact(settings.database_url)}: {reason[:300]}",
              file=sys.stderr)
        return 1


def _missing_sqlite_file(url: str) -> bool:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    name = parsed.database or ""
    return (parsed.get_backend_name() == "sqlite" and name not in ("", ":memory:")
            and not name.startswith("file:") and not Path(name).exists())


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser, res: Resources) -> int:
    if args.command == "migrate":
        from tasks.migrate import upgrade

        upgrade(res.engine)
        print("schema is up to date")
    elif args.command == "seed":
        from tasks.examples.seed import seed_cm_data

        if args.rows < 0:
            parser.error("rows must be >= 0")
        first, last = seed_cm_data(res.engine, args.rows)
        print(f"seeded ids {first}..{last}")
    elif args.command == "status":
        return _status(args, res)
    return 0


def _status(args: argparse.Namespace, res: Resources) -> int:
    from sqlalchemy import inspect

    from tasks.ranges.status import partitions, render
    from tasks.restock.clock import wall_ms
    from tasks.restock.nodes import stock_nodes
    from tasks.restock.status import render_nodes, restock_nodes
    from tasks.status import render_letters

    if not inspect(res.engine).has_table("work_items"):
        print("the database has no platform tables yet: run `python -m tasks migrate`",
              file=sys.stderr)
        return 1
    render(partitions(res.sessions, args.job))
    now = wall_ms()
    render_nodes(restock_nodes(res.sessions, stock_nodes(res),
                               res.settings.restock_queue_names, now), now)
    render_letters(res.sessions)
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
