"""The demo's operator console (`python -m devtools demo --console`): `python -m tasks console`
on the demo's stores with a password drawn per run, printed once, and kept up until Ctrl-C."""

from __future__ import annotations

import argparse
import secrets
import signal
import time
from typing import Any

from rich.console import Console
from rich.markup import escape

from devtools.fleet import Fleet

__all__ = ["start_console", "hold_console", "interrupted"]


def start_console(args: argparse.Namespace, console: Console, fleet: Fleet) -> None:
    """`python -m tasks console` on the demo's stores, user admin and a password drawn for
    this run: both go to the console's environment only and are printed once, here."""
    password = secrets.token_urlsafe(12)
    env = dict(fleet.env, CONSOLE_USER="admin", CONSOLE_PASSWORD=password,
               CONSOLE_ADDRESS="127.0.0.1", CONSOLE_PORT=str(args.console_port))
    fleet.start("console", "console", module="tasks", env=env)
    try:
        fleet.wait_ready("console", "console: serving")
    except RuntimeError:  # e.g. the port is taken: its last line says so
        lines = (fleet.logs / "console.log").read_text(errors="replace").strip().splitlines()
        console.print(f"[red]the console did not start: {escape(lines[-1] if lines else '?')}"
                      "[/] (--console-port)", soft_wrap=True)
        raise SystemExit(1) from None
    console.print(f"console: {_console_url(args)}   user: admin   password: {password}   "
                  "(this run only)", soft_wrap=True)


def _console_url(args: argparse.Namespace) -> str:
    return f"http://127.0.0.1:{args.console_port}/"


def interrupted(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def hold_console(args: argparse.Namespace, console: Console, fleet: Fleet) -> None:
    """Keep the console (and the workers it shows) up until Ctrl-C or SIGTERM (then the
    caller stops everything), or until the console exits."""
    proc = fleet.procs["console"]
    console.print(f"the console stays up at {_console_url(args)}: press Ctrl-C to stop the "
                  "demo", soft_wrap=True)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        while proc.poll() is None:
            time.sleep(0.5)
        console.print(f"[red]the console exited ({proc.returncode}); see "
                      f"{fleet.logs / 'console.log'}[/]")
    except KeyboardInterrupt:
        console.print("stopping")
