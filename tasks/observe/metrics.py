"""Prometheus metrics of the processes that do the work: workers (pool processes included) and
beat, served on METRICS_PORT (off when unset) at METRICS_ADDRESS (default 127.0.0.1).

prometheus-client's multiprocess mode does the bookkeeping: `setup()` runs in the worker's
main process before it forks its pool (Celery's `worker_init`) or in beat (`beat_init`); it
makes a fresh directory of its own under the system's temporary directory, points
PROMETHEUS_MULTIPROC_DIR at it before prometheus_client is imported, and serves every pool
process's samples from there, with the series each wing declares (`Wing.series`). A pool
process that exits is marked dead; the directory is removed at shutdown and stale ones (their
process gone) at the next start. Nothing here runs when METRICS_PORT is unset: every `record`
call is then one attribute check.

A port that cannot be bound (another worker on this host has it) raises `MetricsUnavailable`:
the process exits with that one line rather than run without metrics. Once logging is set up,
`announce()` logs where the metrics are served ("metrics on http://ADDR:PORT/metrics").

The shared state (partitions by state, runs, restock nodes, dead letters, queue backlogs) is
served by beat alone, while it leads (`tasks.observe.state`); workers serve their own series:
leases, range batches, restock drains, and per task its run time, failures and retries
(Celery's task signals, `tasks.worker.lifecycle`), and one `worker_up` series per queue the
worker consumes.

Names follow Prometheus conventions: one `rangekeeper_` prefix, base units (seconds), `_total`
for counters. Labels stay bounded: range_job, node, queue, task name, state, reason class,
worker name; never a task id, an order id or a partition number. No label is named `job`:
that is the scrape job's own label (Prometheus would rename ours `exported_job`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tasks.config.settings import Settings
    from tasks.wing import Wing

__all__ = ["setup", "shutdown", "child_exited", "record", "Metrics", "Make",
           "metrics_dir_root", "lost_reason", "announce", "MetricsUnavailable",
           "TASK_BUCKETS", "worker_serving"]

log = logging.getLogger(__name__)

T = TypeVar("T")

PREFIX = "rangekeeper_"
SECONDS_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Tasks run from milliseconds (a control, a ping) to an hour (a partition of a big table).
TASK_BUCKETS = (.005, .025, .1, .5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)


class MetricsUnavailable(Exception):
    """METRICS_PORT is set but cannot be served (the port is taken); the message says which."""


def lost_reason(reason: str) -> str:
    """A lease loss's reason as a bounded label: refused, expired or other."""
    if "refused" in reason:
        return "refused"
    if "safe-until" in reason or "expired" in reason:
        return "expired"
    return "other"


class Make:
    """Makes series with the platform's prefix and buckets; handed to each wing's series class
    (`Wing.series(make)`), so a wing declares its series without importing prometheus_client
    before `setup` may."""

    def __init__(self) -> None:
        import prometheus_client

        self._client = prometheus_client

    def counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> Any:
        return self._client.Counter(PREFIX + name, doc, tuple(labels), registry=None)

    def gauge(self, name: str, doc: str, labels: Iterable[str] = (), mode: Any = "max") -> Any:
        return self._client.Gauge(PREFIX + name, doc, tuple(labels), multiprocess_mode=mode,
                                  registry=None)

    def histogram(self, name: str, doc: str, labels: Iterable[str] = (),
                  buckets: Iterable[float] = SECONDS_BUCKETS) -> Any:
        return self._client.Histogram(PREFIX + name, doc, tuple(labels),
                                      buckets=tuple(buckets), registry=None)


class Metrics:
    """The metric objects of this process (built once prometheus_client may be imported): the
    core's series as attributes, each wing's series object by its class (`of`)."""

    def __init__(self, series: Iterable[type[Any]] = ()) -> None:
        make = Make()
        counter = make.counter
        self.lease = {c: counter(f"lease_{c}", f"leases {c}") for c in
                      ("acquired", "contended", "renewed", "released")}
        self.lease_renewal_failures = counter("lease_renewal_failures",
                                              "renewals refused or lost to a Redis error")
        self.lease_lost = counter("lease_lost", "leases lost, by reason class", ["reason"])
        self.lease_renew_seconds = make.histogram("lease_renew_seconds", "renewal round trips")
        self.lease_margin = make.gauge("lease_safe_margin_min_seconds",
                                       "the least time a lease had left when a renewal was "
                                       "confirmed", mode="min")
        self.task_retries = counter("task_retries", "retries scheduled", ["task"])
        self.task_capped = counter("task_redelivery_dead_letters",
                                   "messages dead-lettered at the redelivery cap", ["task"])
        self.task_runtime = make.histogram("task_runtime_seconds", "task run times, by task",
                                           ["task"], buckets=TASK_BUCKETS)
        self.task_failures = counter("task_failures", "tasks that raised, by task", ["task"])
        self.worker_up = make.gauge("worker_up", "1 for each queue this worker consumes",
                                    ["worker", "queue"])
        self._started: dict[str, float] = {}
        self.wings: dict[type[Any], Any] = {cls: cls(make) for cls in series}

    def of(self, cls: type[T]) -> T:
        """The series object of class `cls` (a wing's `Wing.series`)."""
        found: T = self.wings[cls]
        return found

    # Celery's task signals (tasks.worker.lifecycle), in the process that runs the task -----
    def task_started(self, task_id: str) -> None:
        self._started[task_id] = time.monotonic()

    def task_finished(self, task_id: str, name: str) -> None:
        began = self._started.pop(task_id, None)
        if began is not None:
            self.task_runtime.labels(name).observe(time.monotonic() - began)

    def task_failed(self, name: str) -> None:
        self.task_failures.labels(name).inc()

    def task_retried(self, name: str) -> None:
        self.task_retries.labels(name).inc()

    # lease.stats.Observer ------------------------------------------------------------------
    def counted(self, counter: str, n: int) -> None:
        if not n:
            return
        if counter in self.lease:
            self.lease[counter].inc(n)
        elif counter == "renewal_failures":
            self.lease_renewal_failures.inc(n)

    def renewal(self, rtt: float, margin: float | None) -> None:
        self.lease_renew_seconds.observe(rtt)
        if margin is not None:
            self.lease_margin.set(margin)

    def lost(self, reason: str) -> None:
        self.lease_lost.labels(lost_reason(reason)).inc()


class _Recorder:
    """`record`: the metrics when set up in this process tree, else None (every call site
    checks `record.on` first, so a process without METRICS_PORT pays one attribute read)."""

    def __init__(self) -> None:
        self.on: Metrics | None = None


record = _Recorder()
_state: dict[str, Any] = {}


def metrics_dir_root() -> Path:
    return Path(tempfile.gettempdir()) / "rangekeeper-metrics"


def setup(settings: Settings, role: str, task_names: Iterable[str] = (),
          wings: Iterable[Wing] = (), app: Any = None) -> int | None:
    """Start exporting for this process and the pool processes it will fork; return the port
    served, or None when METRICS_PORT is unset. Call before forking. `task_names`: the tasks
    whose task series start at 0; `wings`: whose series to serve; with `app`, the shared
    state too, while this process leads (beat). Raises `MetricsUnavailable` when the port
    cannot be bound."""
    if settings.metrics_port is None or record.on is not None:
        return None
    root = metrics_dir_root()
    _remove_stale(root)
    directory = root / f"{role}-{os.getpid()}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    _state.update(directory=directory)
    from prometheus_client import CollectorRegistry, start_http_server, values
    from prometheus_client.multiprocess import MultiProcessCollector

    # `celery` imported prometheus_client already (Flower's command plugin), so its value
    # class was chosen before the variable was set: choose again, as its own tests do.
    values.ValueClass = values.get_value_class()

    from lease.stats import set_observer

    wings = tuple(wings)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    if app is not None:
        from tasks.observe.state import StateCollector

        registry.register(StateCollector(settings, app, wings))
    address, wanted = settings.metrics_address, settings.metrics_port
    try:
        server, _thread = start_http_server(wanted, address, registry=registry)
    except OSError as exc:
        shutdown()
        raise MetricsUnavailable(
            f"METRICS_PORT={wanted}: cannot serve metrics on {address}:{wanted} "
            f"({exc.strerror or exc}); each worker and beat on one host needs its own "
            "METRICS_PORT") from exc
    record.on = Metrics(wing.series for wing in wings if wing.series is not None)
    _zero(record.on, settings, task_names)
    set_observer(record.on)
    port = int(server.server_address[1])
    _state.update(server=server, url=f"http://{address}:{port}/metrics ({role})")
    return port


def announce() -> None:
    """Log where this process serves its metrics (once logging is set up)."""
    url = _state.get("url")
    if url is not None:
        log.info("metrics on %s", url)


def worker_serving(worker: str, queues: Iterable[str]) -> None:
    """This worker's `worker_up` series: 1 for each queue it consumes."""
    if record.on is not None:
        for queue in queues:
            record.on.worker_up.labels(worker, queue).set(1)


def _zero(m: Metrics, settings: Settings, task_names: Iterable[str]) -> None:
    for reason in ("refused", "expired", "other"):
        m.lease_lost.labels(reason)
    for name in task_names:
        for metric in (m.task_retries, m.task_capped, m.task_runtime, m.task_failures):
            metric.labels(name)
    # Each wing's labelled series at 0, so every series exists (and a dashboard or an alert
    # sees 0, not nothing) before it first moves.
    for series in m.wings.values():
        series.zero(settings)


def child_exited(pid: int) -> None:
    """A pool process ended: its live gauges stop counting."""
    directory = _state.get("directory")
    if directory is not None:
        from prometheus_client.multiprocess import mark_process_dead

        mark_process_dead(pid, str(directory))


def shutdown() -> None:
    """Stop serving and remove this process's directory."""
    server = _state.pop("server", None)
    if server is not None:
        server.shutdown()
    _state.pop("url", None)
    directory = _state.pop("directory", None)
    if directory is not None and os.environ.get("PROMETHEUS_MULTIPROC_DIR") == str(directory):
        shutil.rmtree(directory, ignore_errors=True)


def _remove_stale(root: Path) -> None:
    """Remove the directories of processes that are gone (killed before their shutdown)."""
    if not root.is_dir():
        return
    for entry in root.iterdir():
        pid = entry.name.rpartition("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
