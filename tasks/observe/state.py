"""The platform's shared state for Prometheus, read once per scrape by one process: the beat
that holds the `beat:leader` lease.

Partitions by state, runs, restock nodes, dead letters and queue backlogs live in the database,
Redis and the broker, not in any one process. Read by every worker on every scrape, they cost
each worker a second per scrape and the dashboard saw one copy per worker; so only beat serves
them (it runs METRICS_PORT like a worker), and only while it leads (`set_leader`, told by
`beat.scheduler.LeaderScheduler`). A standby beat and every worker serve their own series
only. After a failover the series come from the new leader's target, which the dashboard and
the alerts aggregate away (`max by (range_job, state)`), and
`rangekeeper_state_collect_seconds` (how long the last read took) tells that some process
serves the state at all (alert RangekeeperStateMissing).

Sources: the core's own (each platform queue's backlog and its oldest message's age, from
`tasks.worker.backlog`; dead letters by kind) and each wing's `Wing.state` (named as strings,
so a source that cannot be imported is skipped, not fatal). A source that fails (a store away)
is logged and left out of that scrape; the others are still served.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.config.settings import Settings
    from tasks.wing import Wing

__all__ = ["StateCollector", "set_leader", "leading"]

log = logging.getLogger(__name__)

Source = Callable[["Settings"], Iterable[Any]]

_leader = threading.Event()


def set_leader(on: bool) -> None:
    """This process leads (beat's leader lease held) or no longer does."""
    if on:
        _leader.set()
    else:
        _leader.clear()


def leading() -> bool:
    return _leader.is_set()


class StateCollector:
    """A prometheus_client collector of the shared state, silent unless this process leads."""

    def __init__(self, settings: Settings, app: Any, wings: Iterable[Wing]) -> None:
        wings = tuple(wings)
        self.settings = settings
        self.sources: list[Source] = [_queues(app, wings), _dead_letters]
        for spec in (wing.state for wing in wings if wing.state):
            module, _, name = spec.partition(":")
            try:
                self.sources.append(getattr(importlib.import_module(module), name))
            except ImportError:
                log.debug("metrics: no state source %s", spec)

    def collect(self) -> Iterable[Any]:
        if not leading():
            return []
        from prometheus_client.core import GaugeMetricFamily

        began = time.monotonic()
        found: list[Any] = []
        for source in self.sources:
            try:
                found.extend(source(self.settings))
            except Exception as exc:  # a scrape must not fail because a store is away
                log.warning("metrics: %s failed: %s", getattr(source, "__module__", source),
                            type(exc).__name__)
        took = GaugeMetricFamily("rangekeeper_state_collect_seconds",
                                 "how long this scrape's read of the shared state took")
        took.add_metric([], time.monotonic() - began)
        return [*found, took]


def _queues(app: Any, wings: tuple[Wing, ...]) -> Source:
    def collect(settings: Settings) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from tasks.worker.backlog import queue_backlog
        from tasks.worker.queues import queue_names

        messages = GaugeMetricFamily("rangekeeper_queue_messages",
                                     "messages waiting in the queue", labels=["queue"])
        oldest = GaugeMetricFamily("rangekeeper_queue_oldest_seconds",
                                   "age of the queue's oldest waiting message (0: empty)",
                                   labels=["queue"])
        for backlog in queue_backlog(app, queue_names(settings, wings)):
            if backlog.messages is not None:
                messages.add_metric([backlog.name], backlog.messages)
            if backlog.oldest_s is not None or backlog.messages == 0:
                oldest.add_metric([backlog.name], backlog.oldest_s or 0.0)
        return [messages, oldest]

    return collect


def _dead_letters(settings: Settings) -> Iterable[Any]:
    from prometheus_client.core import GaugeMetricFamily

    from tasks.deadletters.kinds import kinds
    from tasks.deadletters.store import DeadLetters
    from tasks.store.resources import resources_for

    counts = {kind: 0 for kind in kinds()}
    counts.update(DeadLetters(resources_for(settings).sessions).counts())
    letters = GaugeMetricFamily("rangekeeper_dead_letters", "dead letters kept, by kind",
                                labels=["kind"])
    for kind, count in sorted(counts.items()):
        letters.add_metric([kind], count)
    return [letters]
