"""`python -m tasks console`: the operator console (tasks/console), a small web app."""

from __future__ import annotations

import logging

import click

from tasks.cli.common import fail

__all__ = ["console"]


@click.command()
def console() -> None:
    """Serve the operator console on CONSOLE_ADDRESS:CONSOLE_PORT (default 127.0.0.1:5566).

    Needs CONSOLE_USER and CONSOLE_PASSWORD (it refuses to start without them, or with a
    password or CONSOLE_SECRET shipped in this repository's examples); FLOWER_URL, when set,
    is linked for task-level detail. Stop it with Ctrl-C or SIGTERM.
    """
    from tasks.celery import settings
    from tasks.console.auth import ConsoleRefused
    from tasks.console.server import serve

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(settings)
    except ConsoleRefused as exc:
        fail(str(exc))
    except OSError as exc:  # the port is taken, or the address is not this host's
        fail(f"console: cannot listen on {settings.console_address}:{settings.console_port} "
             f"(CONSOLE_ADDRESS, CONSOLE_PORT): {exc.strerror or exc}")
