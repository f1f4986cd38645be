"""OpenTelemetry tracing, an optional extra (`pip install -e '.[otel]'`; TRACING=1).

Each pool process wires OpenTelemetry's Celery, SQLAlchemy and Redis instrumentations after it
is forked (Celery's `worker_process_init`, where the platform's connections are made anew
too), and beat and a solo worker at start. Spans go to the exporter TRACING_EXPORTER names:
`otlp` (the OTLP/HTTP exporter; its endpoint and headers come from the standard
OTEL_EXPORTER_OTLP_* variables) or `console`. What the work is about (job, partition, fence,
node: `tasks.observe.logs.bind`) is set as attributes on the current span and on every span started
inside it, so a batch's SQL and Redis spans carry their partition and fence.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tasks.observe import logs

if TYPE_CHECKING:
    from tasks.config.settings import Settings

__all__ = ["setup", "annotate"]

log = logging.getLogger(__name__)
_state: dict[str, Any] = {}


def setup(settings: Settings) -> bool:
    """Start tracing in this process when TRACING is on; False when it is off. Idempotent."""
    if not settings.tracing or _state.get("provider") is not None:
        return False
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "rangekeeper"}))
    provider.add_span_processor(_bound_fields())
    provider.add_span_processor(BatchSpanProcessor(_exporter(settings.tracing_exporter)))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()
    # The instrumentation declares SQLAlchemy < 2.1 and would silently do nothing on 2.1, whose
    # engine events it uses are unchanged (tests/test_tracing.py checks the spans).
    SQLAlchemyInstrumentor().instrument(enable_commenter=False, skip_dep_check=True)
    RedisInstrumentor().instrument()
    logs.on_bind(annotate)
    _state["provider"] = provider
    log.info("tracing on: spans to %s", settings.tracing_exporter)
    return True


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
