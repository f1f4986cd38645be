"""Fixtures for the lease tests: a fake clock, Leases that always stop their threads, helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from lease import Keeper, Lease, Leases

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_leases() -> Iterator[Callable[..., Leases]]:
    """Build Leases (real clock and keeper threads unless told otherwise); stop them after."""
    made: list[Leases] = []

    def make(client: Any, **kwargs: Any) -> Leases:
        leases = Leases(client, **kwargs)
        made.append(leases)
        return leases

    yield make
    for leases in made:
        leases.keeper.stop()


@pytest.fixture
def leases(redis_client: redis.Redis, make_leases: Callable[..., Leases]) -> Leases:
    """Leases on the test database with a real clock and a threaded keeper."""
    return make_leases(redis_client)


@pytest.fixture
def fake_leases(
    redis_client: redis.Redis, make_leases: Callable[..., Leases], clock: FakeClock
) -> Leases:
    """Leases whose keeper has no threads and reads `clock`: call keeper.tick() by hand."""
    keeper = Keeper(redis_client, clock=clock, threads=False)
    return make_leases(redis_client, clock=clock, keeper=keeper)


class RoundTrips:
    """Counts the script round trips a Leases and its keeper make."""

    def __init__(self, leases: Leases, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []  # number of KEYS per call
        for scripts in {id(s): s for s in (leases._scripts, leases.keeper._scripts)}.values():
            monkeypatch.setattr(scripts, "run", self._wrap(scripts.run))

    def _wrap(self, run: Callable[..., Any]) -> Callable[..., Any]:
        def counted(script: Any, keys: Any, args: Any) -> Any:
            self.calls.append(len(keys))
            return run(script, keys, args)

        return counted

    def __len__(self) -> int:
        return len(self.calls)


@contextmanager
def heartbeating(*held: Lease, every: float = 0.02) -> Iterator[None]:
    """Heartbeat `held` from a background thread, as a busy holder would."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            for lease in held:
                if not lease.lost:
                    lease.heartbeat()
            stop.wait(every)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.01) -> bool:
    """Poll `predicate` until true or `timeout` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return predicate()
        time.sleep(step)
    return True


def holder_process(*args: str) -> subprocess.Popen[str]:
    """Start `python -m tests.lease.holder ARGS` with this checkout importable."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lease.holder", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )
