"""What every command of `python -m tasks` shares: the root group and the resources."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from tasks.config.settings import redact

if TYPE_CHECKING:
    from tasks.store.resources import Resources

__all__ = ["cli", "open_resources", "fail", "require_tables", "require_redis", "load_jobs",
           "completion", "JSON_VERSION", "envelope", "emit", "error_json", "wants_json"]

SHELLS = ("bash", "zsh", "fish")

# The version of the `--json` envelope (README "JSON output"): bumped when a field of it changes
# meaning or goes away; a new field inside an item does not bump it.
JSON_VERSION = 1


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


def envelope(kind: str, item: Any = None, items: Sequence[Any] | None = None) -> dict[str, Any]:
    """Every `--json` output's one shape: `{"version": 1, "kind": KIND, "item": {...}}` for one
    thing, `{"version": 1, "kind": KIND, "items": [...]}` for a list of things of KIND."""
    if (item is None) == (items is None):
        raise ValueError("an envelope holds either one item or a list of items")
    body = {"item": item} if items is None else {"items": list(items)}
    return {"version": JSON_VERSION, "kind": kind, **body}


def emit(kind: str, item: Any = None, items: Sequence[Any] | None = None) -> None:
    """Print `envelope(kind, item, items)` on stdout as one line of JSON (the envelope's keys
    first, then each item's in the order its view writes them)."""
    click.echo(json.dumps(envelope(kind, item, items)))


def error_json(message: str, exit_code: int) -> str:
    """A refusal under `--json`, on stderr: the same envelope, of kind `error`."""
    return json.dumps(envelope("error", {"message": message, "exit_code": exit_code}))


def wants_json() -> bool:
    """Whether the running command was given `--json` (its refusals are then JSON too)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.params.get("as_json"))


def fail(message: str) -> NoReturn:
    """Print `message` on stderr (under `--json`, as an `error` envelope) and exit 1: a clear
    refusal, not a usage error."""
    click.echo(error_json(message, 1) if wants_json() else message, err=True)
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

    if not inspect(res.engine).has_table("dead_letters"):  # the core's: whatever WINGS says
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
