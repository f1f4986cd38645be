"""`python -m tasks`: the operator CLI, one click group with a module per concern.

    migrate, status              tasks.cli.core
    jobs <verb> JOB ...          tasks.cli.jobs         (range-job controls and run history)
    deadletters <verb> ...       tasks.cli.deadletters  (list, show, replay, purge)

Each command gets the process's `Resources` through `open_resources()`, which turns a database
that is missing or does not answer into one clear line on stderr and exit code 1. Like
`tasks.__main__` before it, this package sits above the wings: it may import every wing.
"""

from __future__ import annotations

import sys

import click

from tasks.cli.common import cli
from tasks.cli.core import migrate, status

__all__ = ["cli", "main"]

cli.add_command(migrate)
cli.add_command(status)


def _add_groups() -> None:
    """The groups of later modules, when present (each adds itself to `cli` on import)."""
    from importlib import import_module

    for name in ("jobs", "deadletters", "console"):
        try:
            import_module(f"tasks.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"tasks.cli.{name}":
                raise


_add_groups()


def main(argv: list[str]) -> int:
    """Run the CLI on `argv`; return its exit code (click's usage errors give 2)."""
    try:
        cli.main(args=argv, prog_name="python -m tasks", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show(file=sys.stderr)
        return exc.exit_code
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except SystemExit as exc:  # a command's own exit code
        return int(exc.code or 0)
    except BrokenPipeError:  # `python -m tasks status | head`: the reader has what it wants
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
