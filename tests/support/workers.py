"""Real `celery -A tasks worker|beat` subprocesses for integration and chaos tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.support import forkcli

ROOT = Path(__file__).resolve().parents[2]
CELERY = [sys.executable, "-m", "celery", "-A", "tasks"]


def platform_env(**overrides: str) -> dict[str, str]:
    """The environment a platform process runs with in tests: this interpreter, this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `predicate` until it returns something truthy; return that, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)
    return value


def celery_call(env: Mapping[str, str], task: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `celery -A tasks call TASK ARGS...` exactly as a user would."""
    return forkcli.run([*CELERY, "call", task, *args], dict(env), ROOT, 60)


class Proc:
    """A platform subprocess with its output in a log file (read it on failure)."""

    def __init__(self, argv: list[str], env: Mapping[str, str], name: str) -> None:
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
        self._out = self.log.open("wb")
        self.popen = subprocess.Popen(
            argv, env=dict(env), cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.popen.poll() is not None:
                code = self.popen.returncode
                raise RuntimeError(f"{self.name} exited ({code}):\n{self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no {text!r} in {timeout}s:\n{self.output()}")
            time.sleep(0.1)

    def signal(self, sig: int, group: bool = False) -> None:
        if self.popen.poll() is None:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (warm shutdown), then SIGKILL of the whole group if it lingers."""
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        self._out.close()
        return self.popen.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()


def stop_all(procs: list[Proc], timeout: float = 5.0) -> None:
    """Stop every process of `procs` at once (a test's teardown): SIGTERM to each (warm
    shutdown), then wait for all of them, then SIGKILL what lingers after `timeout`. One after
    another, each idle worker's warm shutdown (about 2 s, most of it billiard waiting for its
    pool) added up in every test's teardown; and a teardown has nothing left to check, so a
    process still shutting down after a few seconds (a worker waiting out a busy SQLite
    file on a loaded machine: 20 s seen) is killed."""
    for proc in procs:
        if proc.popen.poll() is None:
            proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.popen.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        proc.stop(timeout=0)


def start_worker(
    env: Mapping[str, str], concurrency: int = 1, name: str | None = None, *extra: str
) -> Proc:
    """Start a prefork worker and wait until it is ready to take tasks."""
    name = name or f"w{uuid.uuid4().hex[:6]}"
    proc = Proc(
        [*CELERY, "worker", "-P", "prefork", "-c", str(concurrency), "-n", f"{name}@%h",
         "--loglevel=INFO", "--without-mingle", "--without-gossip", *extra],
        env, name,
    )
    proc.wait_for("ready.", timeout=60)
    return proc
