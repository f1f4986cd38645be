"""What the restock wing brings to the platform (listed by `tasks.wings`)."""

from __future__ import annotations

from tasks.restock.drain import DEAD_LETTER_KIND
from tasks.restock.maintenance import REBUILD_DEAD_LETTER_KIND
from tasks.restock.metrics import RestockSeries
from tasks.restock.settings import RestockSettings, restock_settings
from tasks.wing import BeatEntry, DeadLetterKind, Route, Wing

__all__ = ["WING"]

WING = Wing(
    name="restock",
    task_modules=("tasks.restock.tasks",),
    tables="tasks.restock.tables",
    settings=RestockSettings,
    # Drains, syncs, rebuilds and orders on their own queue.
    routes=(Route("tasks.restock.*", lambda s: restock_settings(s).queue),),
    # One tick per interval, whatever the number of shards: the tick syncs every shard and
    # sends a drain per shard queue with due entries and a rebuild per shard whose maintenance
    # window is due (tasks.restock.dispatch). Each is idempotent and guarded by the shard's
    # scripts and leases, so a duplicate message changes nothing.
    beat=(BeatEntry("restock-tick", "tasks.restock.tick", lambda s: restock_settings(s).interval),),
    series=RestockSeries,
    state="tasks.restock.metrics:collect",
    dead_letter_kinds=(
        DeadLetterKind(DEAD_LETTER_KIND, "a restock entry is not a task: give the stock back "
                                         "by hand once the entry's problem is fixed"),
        DeadLetterKind(REBUILD_DEAD_LETTER_KIND, "force a rebuild of the node "
                                                 "(tasks.restock.rebuild) once its cause is "
                                                 "fixed"),
    ),
)
