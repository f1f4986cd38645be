"""The demo's processes (`python -m devtools demo`): real `celery -A tasks worker|beat` and
`python -m tasks ...` subprocesses, each in its own session with its output in a log file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["Fleet", "ROOT"]

ROOT = Path(__file__).resolve().parents[1]


class Fleet:
    """The processes the demo started, each with its output in a log file."""

    def __init__(self, env: Mapping[str, str], logs: Path) -> None:
        self.env, self.logs = dict(env), logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str, module: str = "celery",
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """`python -m celery -A tasks ARGV...` (or `python -m tasks ARGV...`: module "tasks")
        in its own session, so the terminal's Ctrl-C reaches only the demo."""
        prefix = ["-m", "celery", "-A", "tasks"] if module == "celery" else ["-m", module]
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen([sys.executable, *prefix, *argv], env=dict(env or self.env),
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def wait_ready(self, name: str, marker: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        path = self.logs / f"{name}.log"
        while marker not in path.read_text(errors="replace"):
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {path}")
            time.sleep(0.2)

    def call(self, task: str, args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "call", task,
                              "--args", args], env=self.env, cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=True)
        return out.stdout.strip()

    def cli(self, *argv: str) -> str:
        """`python -m tasks ARGV...` (the operator CLI) on the demo's stores."""
        out = subprocess.run([sys.executable, "-m", "tasks", *argv], env=self.env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=True)
        return out.stdout.strip()

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
