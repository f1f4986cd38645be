"""The CLI commands the tests run (`python -m tasks ...`, `celery -A tasks call ...`), each in
a process of its own, without each paying the interpreter's start-up and the imports of
SQLAlchemy, redis-py, Celery and kombu again (about 0.6 s of CPU a command, on a suite that
is bound by its two cores).

A fork server per test process: a child interpreter that imports those libraries once and
then, for each command, forks; the fork takes the command's environment, working directory
and argv, points its stdin at /dev/null and its stdout and stderr at files, runs the module
as `python -m MODULE` would (`runpy`, `__main__`) and exits as that process would (its
`SystemExit` code, atexit handlers, stdio flushed). The project's own modules are not
imported by the server: each command imports them under its own environment, so settings
read at import time are the command's. What is shared is only what a fresh interpreter would
import the same way whatever the environment.

`run(argv, env, cwd, timeout)` returns a `subprocess.CompletedProcess` like
`subprocess.run(..., capture_output=True, text=True)`; past `timeout` the command's process
is killed and `subprocess.TimeoutExpired` is raised. Commands of one test process run one at
a time (a lock): tests that need two at once use `subprocess` directly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["run"]

# Libraries every command imports; none reads the project's settings when imported.
PRELOAD = ("sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.sqlite", "redis", "celery",
           "celery.app", "celery.bin.celery", "kombu", "kombu.transport.redis", "click",
           "psycopg", "pymysql", "rich.console", "croniter", "yaml", "dateutil.parser")

_SERVER = r'''
import importlib, json, os, runpy, signal, sys, tempfile
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
requests, replies = sys.stdin, sys.stdout
for line in requests:
    req = json.loads(line)
    out = tempfile.NamedTemporaryFile(prefix="cli-out-", delete=False)
    err = tempfile.NamedTemporaryFile(prefix="cli-err-", delete=False)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.path[0] = req["cwd"]
        sys.argv = req["argv"]
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        sys.exit(0)
    out.close()
    err.close()
    replies.write(json.dumps({"pid": pid, "out": out.name, "err": err.name}) + "\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
    replies.flush()
'''

_lock = threading.Lock()
_server: subprocess.Popen[str] | None = None


def _start() -> subprocess.Popen[str]:
    global _server
    if _server is None or _server.poll() is not None:
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=str(root))
        _server = subprocess.Popen([sys.executable, "-c", _SERVER, ",".join(PRELOAD)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                   cwd=root, text=True)
    return _server


def _module(argv: Sequence[str]) -> tuple[str, list[str]]:
    """`[python, -m, MODULE, args...]` -> (MODULE, [MODULE's argv[0], args...])."""
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        raise ValueError(f"not a `python -m MODULE` command: {list(argv)[:4]}")
    return argv[2], [argv[2], *argv[3:]]


def run(argv: Sequence[str], env: Mapping[str, str], cwd: str | Path,
        timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `python -m MODULE ARGS` (`argv`) as its own process; see the module's doc."""
    module, args = _module(argv)
    with _lock:
        server = _start()
        assert server.stdin is not None and server.stdout is not None
        request = {"module": module, "argv": args, "env": dict(env), "cwd": str(cwd)}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        started = json.loads(server.stdout.readline())
        reply = _wait(server.stdout, started["pid"], timeout)
        stdout, stderr = _read(started["out"]), _read(started["err"])
    if reply is None:
        raise subprocess.TimeoutExpired(list(argv), timeout, stdout, stderr)
    return subprocess.CompletedProcess(list(argv), reply["status"], stdout, stderr)


def _wait(replies: IO[str], pid: int, timeout: float) -> dict[str, Any] | None:
    """The command's exit reply; None (its process group killed) if it outlasts `timeout`."""
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        reply: dict[str, Any] = json.loads(replies.readline())
    finally:
        timer.cancel()
    return None if expired.is_set() else reply


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    finally:
        os.unlink(path)
