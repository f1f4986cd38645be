"""The range wing's settings section: RANGE_SLICE, RANGE_SETTLE, RANGE_RUNNERS,
RANGE_RUNNER_WAIT, RANGE_SCHEDULE_TICK, RANGE_SCHEDULE_GRACE, RANGE_HOOK_RESEND and
RANGES_QUEUE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tasks.config import envparse
from tasks.config.settings import Section, Settings, SettingsError, setting

__all__ = ["RangeSettings", "range_settings"]


@dataclass(frozen=True)
class RangeSettings(Section):
    """What range jobs read from the environment (RANGE_ + the field's name). Seconds."""

    ENV_PREFIX: ClassVar[str] = "RANGE_"

    # A partition task hands its partition back after this long, to stay within time limits.
    slice: float = setting(300.0, envparse.positive(float))
    # A finished partition is checked once more for rows committed late (a transaction that
    # was open across its closing read) this long after it finished.
    settle: float = setting(60.0, envparse.positive(float))
    # Runner messages of one job outstanding at most (tasks.ranges.runners): each one runs
    # partitions of the job one after another, claiming the next itself, so this is how many
    # worker slots one job may occupy at once. Set it to the worker slots of the fleet that
    # serve the job (workers x concurrency); more only queue messages that wait.
    runners: int = setting(4, envparse.positive(int))
    # A runner message still queued after this long no longer counts as outstanding: the
    # reconciler replaces it (a broker that lost it); if it arrives later it runs only if the
    # job has room for it.
    runner_wait: float = setting(600.0, envparse.positive(float))
    # Beat (the leader only) fires the jobs' cron schedules this often (tasks.ranges.timetable):
    # a due time starts its run up to this late. A due time passed longer ago than the grace
    # was missed (no beat ran): the schedule's missed-run policy says what it does.
    schedule_tick: float = setting(5.0, envparse.positive(float))
    schedule_grace: float = setting(60.0, envparse.positive(float))
    # A hook owed this long since its message was sent or last tried is sent again
    # (tasks.ranges.outbox): keep it above TIME_LIMIT plus a hook's retries, or a hook still
    # running is sent again.
    hook_resend: float = setting(3900.0, envparse.positive(float))
    # The Celery queue of partitions (tasks.ranges.run_partition); controls go to the core's
    # CONTROL_QUEUE.
    queue: str = setting("ranges", envparse.queue, env="RANGES_QUEUE")

    def check(self, settings: Settings) -> None:
        if self.schedule_grace < 2 * self.schedule_tick:
            raise SettingsError(
                f"RANGE_SCHEDULE_GRACE ({self.schedule_grace:g}) must be at least twice "
                f"RANGE_SCHEDULE_TICK ({self.schedule_tick:g}), or a tick that is merely late "
                "counts its due time as missed")
        if self.slice >= settings.soft_time_limit:
            raise SettingsError(
                f"RANGE_SLICE ({self.slice:g}) must be below SOFT_TIME_LIMIT "
                f"({settings.soft_time_limit:g})"
            )


def range_settings(settings: Settings) -> RangeSettings:
    """The range section of `settings`."""
    return settings.section(RangeSettings)
