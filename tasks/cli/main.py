"""The root of the operator CLI: every command on one click group, and the two ways to run it
(`python -m tasks ...` through `tasks.__main__`, and the `rangekeeper` console script)."""

from __future__ import annotations

import sys

import click

from tasks.cli.common import cli, completion, error_json
from tasks.cli.console import console
from tasks.cli.core import migrate, status
from tasks.cli.deadletters import deadletters
from tasks.cli.jobs import jobs

__all__ = ["cli", "main", "run"]

for _command in (migrate, status, jobs, deadletters, console, completion):
    cli.add_command(_command)


def main(argv: list[str], prog_name: str = "python -m tasks") -> int:
    """Run the CLI on `argv`; return its exit code (click's usage errors give 2). With
    `--json`, every refusal is an `error` envelope on stderr (`tasks.cli.common.error_json`)."""
    try:
        return _run(argv, prog_name)
    except _Refused as exc:
        text = error_json(exc.message, exc.code) if "--json" in argv else \
            f"{prog_name}: {exc.message}"
        print(text, file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `python -m tasks status | head`: the reader has what it wants
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


class _Refused(Exception):
    """A setting, a module or the command line refused before or around a command."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def _run(argv: list[str], prog_name: str) -> int:
    from tasks.config.envparse import SettingsError

    try:
        cli.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except SettingsError as exc:  # a bad variable: its name and the reason, no traceback
        raise _Refused(str(exc), 2) from None
    except ModuleNotFoundError as exc:
        module = _extra_module(exc)
        if module is None:
            raise
        raise _Refused(f"EXTRA_TASK_MODULES names {module!r}, which cannot be imported "
                       f"({exc})", 2) from None
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        if "--json" in argv:
            raise _Refused(exc.format_message(), exc.exit_code) from None
        exc.show(file=sys.stderr)
        return exc.exit_code
    except click.exceptions.Abort:
        raise _Refused("aborted", 1) from None
    except SystemExit as exc:  # a command's own exit code
        return int(exc.code or 0)
    return 0


def _extra_module(exc: ModuleNotFoundError) -> str | None:
    """The module of EXTRA_TASK_MODULES that `exc` failed to import (None: another import)."""
    from tasks.config.envparse import SettingsError
    from tasks.config.settings import load_settings

    try:
        modules = load_settings().extra_task_modules
    except SettingsError:
        return None
    missing = exc.name or ""
    for module in modules:
        if missing and (module == missing or module.startswith(missing + ".")):
            return module
    return None


def run() -> None:
    """The `rangekeeper` console script (pyproject's [project.scripts]): the same group."""
    sys.exit(main(sys.argv[1:], prog_name="rangekeeper"))
