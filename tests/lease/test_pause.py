"""A holder frozen past its TTL (SIGSTOP) wakes up lost, with an older fence than the new one."""

from __future__ import annotations

import os
import signal
import time

import redis

from lease import Leases
from tests.lease.conftest import holder_process


def test_paused_holder_wakes_up_lost(
    redis_url: str, redis_client: redis.Redis, leases: Leases
) -> None:
    proc = holder_process("hold", redis_url, "paused", "1.0")
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline().split()
        assert first[0] == "acquired"
        old_fence = int(first[1])
        time.sleep(0.4)  # a few renewals happen
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()

        # The frozen holder cannot renew: its key lapses within one TTL and we take over.
        lease = leases.acquire("paused", ttl=10.0, blocking=True, timeout=3.0)
        acquired = time.monotonic()
        assert acquired - stopped < 1.5
        assert lease.fence > old_fence
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = out.splitlines()
    assert f"callback lost {old_fence}" in lines  # from the keeper thread, in any order
    steps = [line for line in lines if not line.startswith("callback")]
    # Every way the woken holder could act under the lease now fails, and changes nothing.
    assert steps[-5:] == [
        f"event True {old_fence}", "check LeaseLost", "renew LeaseLost", "release LeaseLost",
        "exit",
    ]
    assert redis_client.get(lease._key) == lease.token.encode()
    # Its TTL is what our acquire set, less the time since (however busy the machine): the
    # woken holder neither renewed nor shortened it.
    left = redis_client.pttl(lease._key)
    assert 10_000 - (time.monotonic() - acquired) * 1000 - 250 < left <= 10_000
    assert leases.current_fence("paused") == lease.fence
