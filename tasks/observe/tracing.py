"""OpenTelemetry tracing, an optional extra (`pip install -e '.[otel]'`; TRACING=1).

Each pool process wires OpenTelemetry's Celery instrumentation after it is forked (Celery's
`worker_process_init`, where the platform's connections are made anew too), and beat and a
solo worker at start. Spans go to the exporter TRACING_EXPORTER names: `otlp` (the OTLP/HTTP
exporter; its endpoint and headers come from the standard OTEL_EXPORTER_OTLP_* variables) or
`console`.

What a trace holds, by default: a span per task (Celery's `run/...`, and `apply_async/...` for
each message a task sends) and, below a range task's span, a span per batch (`batch`, made
by the range runner) with its job, partition, fence, rows, batch size and checkpoint. Statement
spans (one per SQL statement, one per Redis command) are off: a partition runs thousands of
statements per second, which made a task's trace tens of thousands of spans. TRACING_STATEMENTS
(`sql`, `redis`, or both) turns them on, and TRACING_MAX_SPANS bounds every trace anyway:
past that many spans below one task in one process the rest are dropped, counted on the task's
span (`rangekeeper.spans_dropped`) and in a log line. Which traces are kept at all is the
sampler's, from the standard OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (checked with
the settings; parent-based by default, so a task follows the decision of what sent it).

What the work is about (job, partition, fence, node: `tasks.observe.logs.bind`) is set as
attributes on the current span and on every span started inside it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tasks.observe import logs

if TYPE_CHECKING:
    from tasks.config.settings import Settings

__all__ = ["setup", "annotate", "batch", "bounded", "sampler", "BatchSpan", "Bound", "DROPPED"]

log = logging.getLogger(__name__)
_state: dict[str, Any] = {}
# The tracer of the batch spans, set by `setup`; None while tracing is off, which is all the
# range runner's hot path looks at.
_tracer: Any = None

# The attribute of a task's span that counts the spans dropped below it (TRACING_MAX_SPANS).
DROPPED = "rangekeeper.spans_dropped"


def setup(settings: Settings) -> bool:
    """Start tracing in this process when TRACING is on; False when it is off. Idempotent."""
    global _tracer
    if not settings.tracing or _state.get("provider") is not None:
        return False
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "rangekeeper"}),
                              sampler=sampler(settings))
    provider.add_span_processor(_bound_fields())
    provider.add_span_processor(
        bounded(BatchSpanProcessor(_exporter(settings.tracing_exporter)),
                settings.tracing_max_spans))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()
    if "sql" in settings.tracing_statements:
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        # The instrumentation declares SQLAlchemy < 2.1 and would silently do nothing on 2.1,
        # whose engine events it uses are unchanged (tests/test_tracing.py checks the spans).
        SQLAlchemyInstrumentor().instrument(enable_commenter=False, skip_dep_check=True)
    if "redis" in settings.tracing_statements:
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        RedisInstrumentor().instrument()
    logs.on_bind(annotate)
    _state["provider"] = provider
    _tracer = trace.get_tracer("rangekeeper.ranges")
    log.info("tracing on: spans to %s (statements: %s; at most %d spans per task)",
             settings.tracing_exporter, ",".join(settings.tracing_statements) or "none",
             settings.tracing_max_spans)
    return True


def sampler(settings: Settings) -> Any:
    """The sampler OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG name (checked with the
    settings: the SDK itself falls back to sampling everything on a bad name)."""
    from opentelemetry.sdk.trace import sampling

    kind, ratio = settings.tracing_sampler, settings.tracing_sampler_arg
    found: dict[str, Any] = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "parentbased_always_on": sampling.DEFAULT_ON,
        "parentbased_always_off": sampling.DEFAULT_OFF,
        "traceidratio": sampling.TraceIdRatioBased(ratio),
        "parentbased_traceidratio": sampling.ParentBasedTraceIdRatio(ratio),
    }
    return found[kind]


class BatchSpan:
    """The span of one batch of a range partition, current while the batch runs (so what
    the batch does with tracing on, statements included, is below it)."""

    __slots__ = ("_scope", "_span")

    def __init__(self, job: str, partition: int, fence: int, size: int | None) -> None:
        attributes: dict[str, Any] = {"rangekeeper.job": job, "rangekeeper.partition": partition,
                                      "rangekeeper.fence": fence}
        if size is not None:
            attributes["rangekeeper.batch_size"] = size
        self._scope = _tracer.start_as_current_span("batch", attributes=attributes)
        self._span: Any = None

    def __enter__(self) -> BatchSpan:
        self._span = self._scope.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        return self._scope.__exit__(kind, exc, tb)  # type: ignore[no-any-return]

    def done(self, rows: int, checkpoint: int | str) -> None:
        """The batch committed `rows` rows; `checkpoint` is where the partition is now, or its
        final status when the batch ended it."""
        if self._span is not None and self._span.is_recording():
            self._span.set_attribute("rangekeeper.rows", rows)
            self._span.set_attribute("rangekeeper.checkpoint" if isinstance(checkpoint, int)
                                     else "rangekeeper.status", checkpoint)


class _NoSpan:
    """What `batch` gives while tracing is off: nothing, at the cost of two calls."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def done(self, rows: int, checkpoint: int | str) -> None:
        return None


_OFF = _NoSpan()


def batch(job: str, partition: int, fence: int, size: int | None = None) -> BatchSpan | _NoSpan:
    """A context manager around one batch: a span (a child of the task's) when tracing is on,
    nothing when it is off. Call `done(rows, checkpoint)` on it when the batch committed."""
    if _tracer is None:
        return _OFF
    return BatchSpan(job, partition, fence, size)


def annotate(fields: Mapping[str, Any]) -> None:
    """Set `fields` as attributes of the current span (job, partition, fence, node)."""
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({f"rangekeeper.{k}": _attribute(v) for k, v in fields.items()})


def _attribute(value: Any) -> Any:
    return value if isinstance(value, (str, bool, int, float)) else str(value)


def _exporter(kind: str) -> Any:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _bound_fields() -> Any:
    """A span processor: every span started inside `tasks.observe.logs.bind` carries its fields."""
    from opentelemetry.sdk.trace import SpanProcessor

    class BoundFields(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            fields = logs.bound()
            if fields:
                span.set_attributes({f"rangekeeper.{k}": _attribute(v)
                                     for k, v in fields.items()})

    return BoundFields()


def bounded(inner: Any, limit: int) -> Any:
    """A span processor that passes spans on to `inner` (the exporting one) up to `limit` per
    local trace, then drops them (`Bound` decides which).

    A local trace is a span whose parent is remote, absent or not open in this process (a
    task's `run/...` span: its parent is the span of whoever sent the message) and every span
    started below it here. The first `limit` spans started are kept (the root counts), so
    every kept span's parent is kept too: the trace stays one tree, cut at its end, never a
    forest of orphans. Each dropped span raises `rangekeeper.spans_dropped` on the root, which
    is still open, and a log line says how many were dropped when it ends. The bound holds per
    process: a trace that spans tasks on several workers (a reconcile round and the partitions
    it sent) is bounded in each.
    """
    from opentelemetry.sdk.trace import SpanProcessor

    bound = Bound(limit)

    class Bounded(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            if bound.started(span):
                inner.on_start(span, parent_context=parent_context)

        def on_end(self, span: Any) -> None:
            if bound.ended(span):
                inner.on_end(span)

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return Bounded()


class _Local:
    """A local trace: its root span, the spans passed (the root's included) and dropped."""

    __slots__ = ("root", "passed", "dropped")

    def __init__(self, root: Any) -> None:
        self.root, self.passed, self.dropped = root, 1, 0


class Bound:
    """Which spans pass: the first `limit` started in each local trace (see `bounded`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()  # spans start and end on any thread
        # Each open span -> its local trace and whether it passes (open spans only: as many
        # as are nested at once).
        self._open: dict[int, tuple[_Local, bool]] = {}

    def started(self, span: Any) -> bool:
        """Whether `span`, just started, passes; a dropped one is counted on its root."""
        parent = span.parent
        with self._lock:
            above = None if parent is None or parent.is_remote else self._open.get(parent.span_id)
            if above is None:  # a local root
                self._open[span.context.span_id] = (_Local(span), True)
                return True
            local = above[0]
            passes = local.passed < self.limit
            self._open[span.context.span_id] = (local, passes)
            if passes:
                local.passed += 1
            else:
                local.dropped += 1
                local.root.set_attribute(DROPPED, local.dropped)
            return passes

    def ended(self, span: Any) -> bool:
        """Whether `span` (a ReadableSpan, just ended) passes."""
        with self._lock:
            local, passes = self._open.pop(span.context.span_id, (None, True))
        if passes and local is not None and local.dropped and \
                local.root.context.span_id == span.context.span_id:
            log.info("trace %032x: %d spans below %s dropped (TRACING_MAX_SPANS=%d)",
                     span.context.trace_id, local.dropped, span.name, self.limit)
        return passes
