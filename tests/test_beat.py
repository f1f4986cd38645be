"""HA beat: two `celery -A tasks beat` processes, only the lease holder emits."""

from __future__ import annotations

import re
import time

import pytest

from tests.support.redis_server import RedisServer
from tests.support.workers import CELERY, Proc, platform_env

SENT = re.compile(r"Sending due task reconcile-range-jobs")


def sends(proc: Proc) -> int:
    return len(SENT.findall(proc.output()))


@pytest.mark.timeout(120)
def test_only_the_leader_ticks_and_the_standby_takes_over_within_one_ttl(
    private_redis: RedisServer, tmp_path: object
) -> None:
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=f"sqlite:///{tmp_path}/b.db",
                       LEASE_TTL="1.5", RECONCILE_INTERVAL="0.5")
    first = Proc([*CELERY, "beat", "--loglevel=INFO"], env, "beat-a")
    second = None
    try:
        first.wait_for("became leader", timeout=60)
        second = Proc([*CELERY, "beat", "--loglevel=INFO"], env, "beat-b")
        second.wait_for("beat: Starting...", timeout=60)
        time.sleep(3)
        assert sends(first) >= 4
        assert sends(second) == 0 and "became leader" not in second.output()
        killed_at = time.monotonic()
        first.kill()
        second.wait_for("became leader", timeout=10)
        took = time.monotonic() - killed_at
        assert took < 1.5 + 1.0, f"takeover took {took:.1f}s"
        before = sends(second)
        time.sleep(2)
        assert sends(second) > before
    finally:
        first.stop()
        if second is not None:
            second.stop()
