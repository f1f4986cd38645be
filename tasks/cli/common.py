"""What every command of `python -m tasks` shares: the root group and the resources."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from tasks.config.settings import redact

if TYPE_CHECKING:
    from tasks.store.resources import Resources

__all__ = ["cli", "open_resources", "fail", "require_tables", "require_redis", "load_jobs",
           "completion"]

SHELLS = ("bash", "zsh", "fish")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rangekeeper", message="%(prog)s %(version)s")
def cli() -> None:
    """Operate rangekeeper: the schema, the demo table, status, range-job controls and dead
    letters. Settings come from the environment (REDIS_URL, DATABASE_URL, ...)."""


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script of the `rangekeeper` command for SHELL; for example
    `eval "$(rangekeeper completion bash)"` in ~/.bashrc."""
    from click.shell_completion import get_completion_class

    found = get_completion_class(shell)
    assert found is not None  # every choice is one of click's own shells
    root = ctx.find_root().command
    click.echo(found(root, {}, "rangekeeper", "_RANGEKEEPER_COMPLETE").source())


def load_jobs() -> None:
    """Register the jobs a worker knows: import the app's task modules (EXTRA_TASK_MODULES
    included), as `celery -A tasks worker` does; a module that cannot be imported ends the
    command with one line (`tasks.cli.main`)."""
    from tasks.celery import app

    app.loader.import_default_modules()


def fail(message: str) -> NoReturn:
    """Print `message` on stderr and exit 1 (a clear refusal, not a usage error)."""
    click.echo(message, err=True)
    sys.exit(1)


@contextmanager
def open_resources(need_file: bool = True) -> Iterator[Resources]:
    """This process's `Resources`; a database that is missing or does not answer ends the
    command with one line naming DATABASE_URL (credentials redacted), no traceback."""
    from sqlalchemy.exc import OperationalError

    from tasks.celery import settings
    from tasks.store.resources import resources_for

    if need_file and _missing_sqlite_file(settings.database_url):
        fail(f"DATABASE_URL={redact(settings.database_url)}: the database file does not exist"
             ": run `python -m tasks migrate` to create it")
    res = resources_for(settings)
    try:
        yield res
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        fail(f"cannot use DATABASE_URL={redact(settings.database_url)}: {reason[:300]}")


def require_tables(res: Resources) -> None:
    """Exit with a clear line when the platform's tables were never created."""
    from sqlalchemy import inspect

    if not inspect(res.engine).has_table("work_items"):
        fail("the database has no platform tables yet: run `python -m tasks migrate`")


def require_redis(res: Resources) -> None:
    """Exit with a clear line when REDIS_URL does not answer a PING (credentials redacted):
    the compose and k8s probes that run a command read its exit code."""
    from redis.exceptions import RedisError

    try:
        res.redis.ping()
    except (RedisError, OSError) as exc:
        reason = redact(" ".join(str(exc).split()))[:200]
        fail(f"cannot reach Redis (REDIS_URL={redact(res.settings.redis_url)}): "
             f"{type(exc).__name__}: {reason}")


def _missing_sqlite_file(url: str) -> bool:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    name = parsed.database or ""
    return (parsed.get_backend_name() == "sqlite" and name not in ("", ":memory:")
            and not name.startswith("file:") and not Path(name).exists())
