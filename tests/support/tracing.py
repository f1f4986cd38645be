"""Test-only: an in-memory span exporter in each pool process, and a task that returns what it
holds (the worker runs with TRACING=1; see tests/test_tracing.py)."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_process_init

from tasks.celery import app

_memory: list[Any] = []


@worker_process_init.connect
def _add_memory_exporter(**_: Any) -> None:
    # Connected after tasks.worker.lifecycle's handler (this module is imported later), so the
    # platform's provider is set when this runs.
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[attr-defined]
    _memory.append(exporter)


@app.task(name="tests.support.tracing.spans")
def spans() -> list[dict[str, Any]]:
    """The spans this pool process finished so far: name, kind and attributes."""
    if not _memory:
        return []
    return [{"name": s.name, "attributes": dict(s.attributes or {})}
            for s in _memory[0].get_finished_spans()]
