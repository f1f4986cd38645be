"""HA beat: two `celery -A tasks beat` processes, only the lease holder emits."""

from __future__ import annotations

import logging
import re
import time

import pytest

from tests.support.redis_server import RedisServer
from tests.support.workers import CELERY, Proc, platform_env

# The platform's ticks are logged at DEBUG only (beat.scheduler.QuietTicks).
SENT = re.compile(r"Sending due task reconcile-range-jobs")


def sends(proc: Proc) -> int:
    return len(SENT.findall(proc.output()))


@pytest.mark.timeout(120)
def test_only_the_leader_ticks_and_the_standby_takes_over_within_one_ttl(
    private_redis: RedisServer, tmp_path: object
) -> None:
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=f"sqlite:///{tmp_path}/b.db",
                       LEASE_TTL="1.5", RECONCILE_INTERVAL="0.5")
    first = Proc([*CELERY, "beat", "--loglevel=DEBUG"], env, "beat-a")
    second = None
    try:
        first.wait_for("became leader", timeout=60)
        second = Proc([*CELERY, "beat", "--loglevel=DEBUG"], env, "beat-b")
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


def test_frequent_ticks_are_quiet_at_info_and_a_nightly_entry_is_not() -> None:
    from datetime import timedelta
    from types import SimpleNamespace

    from celery.beat import ScheduleEntry
    from celery.schedules import crontab, schedule

    from beat.scheduler import SENDING, QuietTicks
    from tasks.celery import app

    entries = {"reconcile-range-jobs": ScheduleEntry(
                   "reconcile-range-jobs", "tasks.ranges.reconcile",
                   schedule=schedule(timedelta(seconds=5)), app=app),
               "nightly": ScheduleEntry("nightly", "reports.nightly",
                                        schedule=crontab(hour=2, minute=0), app=app),
               "hourly": ScheduleEntry("hourly", "reports.hourly",
                                       schedule=schedule(timedelta(hours=1)), app=app)}
    quiet = QuietTicks(SimpleNamespace(schedule=entries))  # type: ignore[arg-type]
    logger = logging.getLogger("celery.beat")

    def shown(name: str) -> bool:
        record = logger.makeRecord("celery.beat", logging.INFO, __file__, 1, SENDING,
                                   (name, entries[name].task), None)
        return quiet.filter(record)

    old = logger.level
    try:
        logger.setLevel(logging.INFO)
        assert not shown("reconcile-range-jobs")
        assert shown("nightly") and shown("hourly")
        logger.setLevel(logging.DEBUG)
        assert shown("reconcile-range-jobs")
    finally:
        logger.setLevel(old)
