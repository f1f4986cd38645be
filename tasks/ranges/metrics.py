"""The range wing's metric series (`RangeSeries`, served by `tasks.observe.metrics`) and its
state for Prometheus, read at scrape time by the leading beat (`tasks.observe.state`):
partitions by job and state, the rows done and planned per job (from the work rows), and the
state of each job's latest run (one series per state, 1 for the run's state and 0 for the
others). The job's label is `range_job`: `job` is the scrape job's own label in Prometheus."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select

from tasks.config.settings import Settings
from tasks.ranges.tables import RANGE_RUNS, WORK, RunState
from tasks.ranges.workrow import every_partition

__all__ = ["RangeSeries", "collect"]


def collect(settings: Settings) -> Iterable[Any]:
    from prometheus_client.core import GaugeMetricFamily

    from tasks.store.resources import resources_for

    res = resources_for(settings)
    w = WORK.c
    query = (select(w.job, w.status, func.count(), func.sum(w.rows_done),
                    func.sum(w.hi - w.lo + 1))
             .where(every_partition()).group_by(w.job, w.status))
    latest = select(func.max(RANGE_RUNS.c.id)).group_by(RANGE_RUNS.c.job)
    with res.sessions() as session:
        rows = session.execute(query).all()
        runs = session.execute(select(RANGE_RUNS.c.job, RANGE_RUNS.c.state)
                               .where(RANGE_RUNS.c.id.in_(latest.scalar_subquery()))).all()
    p = "rangekeeper_range_"
    parts = GaugeMetricFamily(p + "partitions", "partitions by state",
                              labels=["range_job", "state"])
    done = GaugeMetricFamily(p + "rows_done", "rows processed by the job's partitions",
                             labels=["range_job"])
    planned = GaugeMetricFamily(p + "ids_planned", "ids covered by the job's partitions",
                                labels=["range_job"])
    totals: dict[str, list[int]] = {}
    for job, state, count, rows_done, ids in rows:
        parts.add_metric([job, state], count)
        total = totals.setdefault(job, [0, 0])
        total[0] += int(rows_done or 0)
        total[1] += int(ids or 0)
    for job, (rows_done, ids) in totals.items():
        done.add_metric([job], rows_done)
        planned.add_metric([job], ids)
    run_state = GaugeMetricFamily(p + "run_state", "1 for the state of the job's latest run",
                                  labels=["range_job", "state"])
    for job, state in runs:
        for each in (*RunState.LIVE, *RunState.ENDED):
            run_state.add_metric([job, each], 1 if each == state else 0)
    return [parts, done, planned, run_state]


class RangeSeries:
    """The range wing's series, labelled by job (label `range_job`,
    `record.on.of(RangeSeries)`)."""

    def __init__(self, make: Any) -> None:
        by_job = ["range_job"]
        self.range_rows = make.counter("range_rows_processed", "rows processed", by_job)
        self.range_batches = make.counter("range_batches", "batches committed", by_job)
        self.range_batch_seconds = make.histogram("range_batch_seconds", "batch times", by_job)
        self.range_batch_size = make.gauge("range_batch_size", "the last batch size", by_job)
        self.range_takeovers = make.counter("range_takeovers", "partitions taken over", by_job)
        self.range_fenced_out = make.counter("range_fenced_out_batches",
                                             "batches rolled back: a newer holder", by_job)
        self.range_throttle_wait = make.counter("range_throttle_wait_seconds",
                                                "time partitions waited for the throttle",
                                                by_job)

    def zero(self, settings: Settings) -> None:
        """Every registered job's series, at 0."""
        from tasks.ranges.jobs import registered_jobs

        for job in registered_jobs():
            for metric in (self.range_rows, self.range_batches, self.range_batch_seconds,
                           self.range_batch_size, self.range_takeovers, self.range_fenced_out,
                           self.range_throttle_wait):
                metric.labels(job.name)
