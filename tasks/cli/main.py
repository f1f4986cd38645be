"""The root of the operator CLI: every command on one click group, and the two ways to run it
(`python -m tasks ...` through `tasks.__main__`, and the `rangekeeper` console script)."""

from __future__ import annotations

import sys

import click

from tasks.cli.common import cli
from tasks.cli.console import console
from tasks.cli.core import migrate, status
from tasks.cli.deadletters import deadletters
from tasks.cli.jobs import jobs

__all__ = ["cli", "main", "run"]

for _command in (migrate, status, jobs, deadletters, console):
    cli.add_command(_command)


def main(argv: list[str], prog_name: str = "python -m tasks") -> int:
    """Run the CLI on `argv`; return its exit code (click's usage errors give 2)."""
    try:
        cli.main(args=argv, prog_name=prog_name, standalone_mode=False)
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


def run() -> None:
    """The `rangekeeper` console script (pyproject's [project.scripts]): the same group."""
    sys.exit(main(sys.argv[1:], prog_name="rangekeeper"))
