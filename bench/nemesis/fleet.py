"""The nemesis run's processes: a private redis-server, real `celery -A tasks worker` and
`celery -A tasks beat` processes, and a supervisor that restarts any of them that died, as the
Procfile's restart loops do (a process killed by a fault comes back after RESTART_S).

Every process runs in its own session, so a signal to its process group reaches the main
process and its pool children, and nothing of the harness.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import redis

from devtools.embedded import redis_binary

__all__ = ["RedisProc", "Member", "Supervisor", "pool_children", "ROOT"]

ROOT = Path(__file__).resolve().parents[2]
RESTART_S = 2.0  # the Procfile's loops wait 2 s before restarting a process that exited
COMMON = ("-P", "prefork", "--loglevel=INFO", "--without-mingle", "--without-gossip")


class RedisProc:
    """A redis-server on 127.0.0.1:`port` without persistence: a restart comes back empty."""

    def __init__(self, port: int, logs: Path) -> None:
        self.port, self.logs = port, logs
        self.dir = tempfile.mkdtemp(prefix="nemesis-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProc:
        log = (self.logs / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [redis_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", self.dir], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError(f"redis-server on port {self.port} did not start; "
                                           f"see {self.logs / 'redis.log'}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart_empty(self) -> None:
        self.kill()
        self.start()


@dataclass
class Member:
    """One supervised process: its argv after `celery -A tasks`, its current Popen."""

    name: str
    argv: tuple[str, ...]
    kind: str  # "range", "control" or "beat"
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    died_at: float | None = None


class Supervisor:
    """Start the members, restart any that exits (after RESTART_S), stop them all at the end."""

    def __init__(self, env: Mapping[str, str], logs: Path) -> None:
        self.env, self.logs = dict(env), logs
        self.members: dict[str, Member] = {}
        self.restarts = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def add_worker(self, name: str, queues: str, concurrency: int, kind: str) -> None:
        argv = ("worker", "-c", str(concurrency), "-n", f"{name}@%h", "-Q", queues, *COMMON)
        self.members[name] = Member(name, argv, kind)

    def add_beat(self, name: str) -> None:
        self.members[name] = Member(name, ("beat", "--loglevel=INFO"), "beat")

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def _spawn(self, member: Member) -> None:
        log = self.log(member.name).open("ab")
        log.write(f"\n--- start {member.starts + 1} ---\n".encode())
        log.flush()
        member.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tasks", *member.argv], env=self.env,
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        member.starts += 1
        member.died_at = None

    def start(self, ready_timeout: float = 120) -> None:
        for member in self.members.values():
            self._spawn(member)
        for member in self.members.values():
            if member.kind != "beat":
                self.wait_ready(member, ready_timeout)
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def wait_ready(self, member: Member, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while "ready." not in self.log(member.name).read_text(errors="replace"):
            assert member.proc is not None
            if member.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{member.name} did not start; see {self.log(member.name)}")
            time.sleep(0.2)

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            with self._lock:
                for member in self.members.values():
                    self._revive(member)

    def _revive(self, member: Member) -> None:
        if member.proc is None or member.proc.poll() is None:
            return
        now = time.monotonic()
        if member.died_at is None:
            member.died_at = now
        elif now - member.died_at >= RESTART_S:
            self._spawn(member)
            self.restarts += 1

    def kill_group(self, name: str, sig: int) -> bool:
        """Send `sig` to the member's process group (main process and pool); False if none."""
        member = self.members[name]
        with self._lock:
            if member.proc is None or member.proc.poll() is not None:
                return False
            try:
                os.killpg(member.proc.pid, sig)
            except ProcessLookupError:
                return False
        return True

    def pid(self, name: str) -> int | None:
        member = self.members[name]
        if member.proc is None or member.proc.poll() is not None:
            return None
        return member.proc.pid

    def wait_all_up(self, timeout: float) -> list[str]:
        """Wait until every member runs (restarted if it died); the names still down."""
        deadline = time.monotonic() + timeout
        while True:
            down = [m.name for m in self.members.values()
                    if m.proc is None or m.proc.poll() is not None]
            if not down or time.monotonic() > deadline:
                return down
            time.sleep(0.2)

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        procs = [m.proc for m in self.members.values() if m.proc is not None]
        for proc in procs:
            _signal_group(proc, signal.SIGCONT)
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def pool_children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (a prefork worker's pool processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return sorted(found)
