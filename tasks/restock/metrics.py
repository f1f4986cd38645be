"""The restock wing's metric series (`RestockSeries`, served by `tasks.observe.metrics`) and its
state for Prometheus, read at scrape time by the leading beat (`tasks.observe.state`):
per shard and queue the delay-queue length, the entries due, the unsynced redo log; per shard
the term, whether it is in maintenance, and its dead letters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tasks.config.settings import Settings
from tasks.restock.clock import wall_ms
from tasks.restock.settings import restock_settings
from tasks.restock.shards import stock_shards
from tasks.restock.status import shard_views

__all__ = ["RestockSeries", "collect"]


def collect(settings: Settings) -> Iterable[Any]:
    from prometheus_client.core import GaugeMetricFamily

    from tasks.store.resources import resources_for

    res = resources_for(settings)
    views = shard_views(res.sessions, stock_shards(res), restock_settings(settings).queue_names,
                          wall_ms())
    p = "rangekeeper_restock_"
    queued = GaugeMetricFamily(p + "queued", "entries in the delay queue", labels=["node", "queue"])
    due = GaugeMetricFamily(p + "due", "delay-queue entries due now", labels=["node", "queue"])
    unsynced = GaugeMetricFamily(p + "unsynced_log_entries", "redo-log entries not yet synced",
                                 labels=["node", "queue"])
    term = GaugeMetricFamily(p + "term", "the node's stock term", labels=["node"])
    window = GaugeMetricFamily(p + "maintenance", "1 while the shard is in maintenance",
                               labels=["node"])
    up = GaugeMetricFamily(p + "node_up", "1 if the shard answered", labels=["node"])
    letters = GaugeMetricFamily(p + "node_dead_letters", "dead letters of the node",
                                labels=["node"])
    for v in views:
        shard = str(v.shard)
        up.add_metric([shard], 0 if v.error else 1)
        letters.add_metric([shard], v.dead_letters)
        if v.error:
            continue
        term.add_metric([shard], v.term or 0)
        window.add_metric([shard], 1 if v.maintaining else 0)
        for queue in v.queued:
            queued.add_metric([shard, queue], v.queued[queue])
            due.add_metric([shard, queue], v.due[queue])
            unsynced.add_metric([shard, queue], v.backlog[queue])
    return [queued, due, unsynced, term, window, up, letters]


class RestockSeries:
    """The restock wing's series, labelled by shard (label `node`, its wire name) and queue
    (`record.on.of(RestockSeries)`)."""

    def __init__(self, make: Any) -> None:
        self.restocked = make.counter("restock_entries", "delay-queue entries settled, by status",
                                      ["node", "queue", "status"])
        self.restock_dead_letters = make.counter("restock_dead_letters", "entries dead-lettered",
                                                 ["node", "queue"])

    def zero(self, settings: Settings) -> None:
        """Every shard's (label `node`) and queue's series, at 0 (statuses: the replies a drain
        can count)."""
        from tasks.restock.replies import ACTIONS, Action

        statuses = [code for code, action in ACTIONS.items()
                    if action in (Action.RESTOCKED, Action.SKIPPED)]
        section = restock_settings(settings)
        for shard in range(section.shards):
            for queue in section.queue_names:
                self.restock_dead_letters.labels(str(shard), queue)
                for status in statuses:
                    self.restocked.labels(str(shard), queue, status)
