"""What the range wing brings to the platform (listed by `tasks.wings`)."""

from __future__ import annotations

from tasks.ranges.metrics import RangeSeries
from tasks.ranges.retries import replay_skip
from tasks.ranges.settings import RangeSettings, range_settings
from tasks.ranges.skips import SKIP_KIND
from tasks.ranges.workrow import DEAD_LETTER_KIND
from tasks.wing import BeatEntry, DeadLetterKind, Route, Wing

__all__ = ["WING"]

WING = Wing(
    name="ranges",
    task_modules=("tasks.ranges.tasks",),
    tables="tasks.ranges.tables",
    settings=RangeSettings,
    # Partitions on their own queue (long: up to RANGE_SLICE each); every other range task
    # (start, reconcile, pause, resume, cancel, retry_failed, throttle, and a control added
    # later) with the controls.
    routes=(Route("tasks.ranges.run_partition", lambda s: range_settings(s).queue),
            Route("tasks.ranges.*", lambda s: s.control_queue)),
    beat=(BeatEntry("reconcile-range-jobs", "tasks.ranges.reconcile",
                    lambda s: s.reconcile_interval),
          BeatEntry("range-schedules", "tasks.ranges.schedules",
                    lambda s: range_settings(s).schedule_tick)),
    series=RangeSeries,
    state="tasks.ranges.metrics:collect",
    dead_letter_kinds=(DeadLetterKind(
        DEAD_LETTER_KIND, "a range partition is resumed, not replayed: fix the cause, then "
                          "start the job again (tasks.ranges.start)"),
                       # A replay takes the row out of quarantine and runs it again
                       # (tasks.ranges.retries).
                       DeadLetterKind(SKIP_KIND, retry=replay_skip)),
)
