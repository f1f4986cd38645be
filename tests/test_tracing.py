"""Tracing (TRACING=1, the `otel` extra): a real prefork worker exports over OTLP/HTTP to a
receiver on loopback (tests/support/otlp.py), and the traces of a range job are read back.

By default a partition task's trace holds its task span, a span per batch with what the batch
did, and a few message spans: no SQL or Redis statement spans. TRACING_STATEMENTS turns those
on, and TRACING_MAX_SPANS bounds what a task exports either way.

`TRACE_ROWS=100000 .venv/bin/pytest -s -q tests/test_tracing.py -k "partition_task or
statement_spans"` prints the span counts of a 100,000-row job's partition tasks, with the
default bound when statements are on (the default run: 1,000 rows, a bound of 40).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, func, select

from examples.seed import seed_cm_data
from tasks.config.settings import SettingsError, load_settings
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.tables import WorkItem
from tests.support.db import fresh_database
from tests.support.otlp import Receiver, Span
from tests.support.workers import celery_call, start_worker, wait_until

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

ROWS = int(os.environ.get("TRACE_ROWS", "1000"))
# Small: 2 partitions of 5 batches; the measurement: the job's own batch of 1,000 rows.
PARTITION, BATCH = (500, 100) if ROWS <= 1000 else (25_000, 1000)
TASK = "run/tasks.ranges.run_partition"
BATCH_SPAN = "batch"
# Spans below a partition task besides its batch spans: the messages it sends (a runner's
# next message, the run's closing round) and, with no batch at all, a surplus runner's.
OVERHEAD = 6


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        yield found


def traced(worker_env: dict[str, str], receiver: Receiver, **extra: str) -> dict[str, str]:
    return dict(worker_env, TRACING="1", TRACING_EXPORTER="otlp",
                OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.endpoint,
                OTEL_BSP_SCHEDULE_DELAY="100", OTEL_BSP_MAX_QUEUE_SIZE="65536",
                CM_DATA_PARTITION_SIZE=str(PARTITION), CM_DATA_BATCH_SIZE=str(BATCH),
                CM_DATA_PARALLELISM="1", CM_DATA_BATCH_DELAY="0", **extra)


def run_job(env: dict[str, str], receiver: Receiver) -> dict[str, tuple[Span, list[Span]]]:
    """Run cm_data over ROWS rows on one prefork worker; each partition task's span (by span
    id) with the spans received below it, once every task that ran a batch has arrived."""
    engine = fresh_database(env["DATABASE_URL"])
    worker = None
    try:
        seed_cm_data(engine, ROWS)
        worker = start_worker(env, 1)
        sent = celery_call(env, "tasks.ranges.start", "--args", '["cm_data"]')
        assert sent.returncode == 0, sent.stderr
        wait_until(lambda: finished(engine), 120, "every partition finished")

        def arrived() -> dict[str, tuple[Span, list[Span]]] | None:
            # Every partition task the worker received has ended and its span is here (a
            # task's span ends after everything below it, so what it keeps came first).
            assert worker is not None
            log = worker.output()
            received, ran = (len(re.findall(r"tasks\.ranges\.run_partition\[[^]]*\] " + word,
                                            log)) for word in ("received", "succeeded"))
            spans = receiver.spans()
            tasks = {t.span_id: (t, receiver.below(t)) for t in spans if t.name == TASK}
            return tasks if ran and ran == received and len(tasks) >= ran else None

        return wait_until(arrived, 30, "the partition tasks' spans")  # type: ignore[no-any-return]
    finally:
        if worker is not None:
            worker.stop()
        engine.dispose()


def finished(engine: Engine) -> bool:
    with engine.connect() as conn:
        states = conn.execute(select(WorkItem.status, func.count()).group_by(WorkItem.status))
        found = dict(states.all())
    return bool(found) and set(found) <= {S.DONE, S.EMPTY}


def is_statement(span: Span) -> bool:
    return any(k.startswith("db.") for k in span.attributes)


@pytest.mark.timeout(120)
def test_a_partition_task_traces_a_span_per_batch_and_no_statements_by_default(
    worker_env: dict[str, str], receiver: Receiver
) -> None:
    tasks = run_job(traced(worker_env, receiver), receiver)
    batches_seen = 0
    for task, below in tasks.values():
        batches = [s for s in below if s.name == BATCH_SPAN]
        batches_seen += len(batches)
        print(f"\n{ROWS} rows: partition task {task.span_id}: {len(below) + 1} spans, "
              f"{len(batches)} batches")
        assert len(below) <= len(batches) + OVERHEAD, [s.name for s in below]
        for span in batches:
            a = span.attributes
            assert a["rangekeeper.job"] == "cm_data"
            assert isinstance(a["rangekeeper.partition"], int)
            assert isinstance(a["rangekeeper.fence"], int) and a["rangekeeper.fence"] > 0
            assert a["rangekeeper.batch_size"] == BATCH
            assert 0 <= a["rangekeeper.rows"] <= BATCH
            assert isinstance(a.get("rangekeeper.checkpoint"), int) or \
                a.get("rangekeeper.status") == S.DONE, a
            assert span.parent_id == task.span_id  # a child of the task's span
    batches = [s for s in receiver.spans() if s.name == BATCH_SPAN]
    assert batches_seen == len(batches)  # every batch span is below a partition task
    assert sum(int(s.attributes["rangekeeper.rows"]) for s in batches) == ROWS
    # One span per batch: a full partition of PARTITION rows takes PARTITION / BATCH batches
    # and one more whose read finds nothing.
    per_partition: dict[int, int] = {}
    for s in batches:
        part = int(s.attributes["rangekeeper.partition"])
        per_partition[part] = per_partition.get(part, 0) + 1
    assert sorted(per_partition.values()) == [PARTITION // BATCH + 1] * (ROWS // PARTITION)
    assert not [s.name for s in receiver.spans() if is_statement(s)]


@pytest.mark.timeout(120)
def test_statement_spans_are_opt_in_and_a_task_trace_is_bounded(
    worker_env: dict[str, str], receiver: Receiver
) -> None:
    small = ROWS <= 1000  # the measurement runs with the default bound
    bound = {"TRACING_MAX_SPANS": "40"} if small else {}
    limit = load_settings(bound).tracing_max_spans
    env = traced(worker_env, receiver, TRACING_STATEMENTS="sql,redis", **bound)
    tasks = run_job(env, receiver)
    spans = receiver.spans()
    by_id = {s.span_id: s for s in spans}
    sql = [s for s in spans if s.attributes.get("db.system") == "sqlite"]
    assert any(by_id.get(s.parent_id, s).name == BATCH_SPAN for s in sql), "no SQL in a batch"
    assert any(s.attributes.get("db.system") == "redis" for s in spans)
    dropped = 0
    for task, below in tasks.values():
        assert len(below) + 1 <= limit
        dropped += int(task.attributes.get("rangekeeper.spans_dropped", 0))
        print(f"\n{ROWS} rows, statements on: partition task {task.span_id}: "
              f"{len(below) + 1} spans kept, "
              f"{task.attributes.get('rangekeeper.spans_dropped', 0)} dropped")
    assert dropped > 0 or not small  # ten batches of a few statements each are past 40


def test_the_bound_drops_spans_past_the_limit_and_counts_them_on_the_root() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tasks.observe.tracing import DROPPED, bounded

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(bounded(SimpleSpanProcessor(exporter), 10))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("task"):
        for i in range(30):
            with tracer.start_as_current_span(f"batch {i}"):
                pass
    with tracer.start_as_current_span("next task"):  # a new trace starts from zero
        with tracer.start_as_current_span("batch"):
            pass
    with tracer.start_as_current_span("nested task"):  # spans below spans: cut by start order
        for i in range(5):
            with tracer.start_as_current_span(f"nested batch {i}"):
                for j in range(3):
                    with tracer.start_as_current_span(f"statement {i}.{j}"):
                        pass
    done = exporter.get_finished_spans()
    assert [s.name for s in done[:13]] == [f"batch {i}" for i in range(9)] + [
        "task", "batch", "next task", "statement 0.0"]
    assert done[9].attributes[DROPPED] == 21
    assert DROPPED not in (done[11].attributes or {})
    nested = done[12:]
    assert [s.name for s in nested] == [
        "statement 0.0", "statement 0.1", "statement 0.2", "nested batch 0",
        "statement 1.0", "statement 1.1", "statement 1.2", "nested batch 1",
        "nested batch 2", "nested task"]  # batch 2's statements and batches 3, 4 dropped
    assert nested[-1].attributes[DROPPED] == 3 + 2 * 4
    kept = {s.context.span_id for s in nested}
    assert all(s.parent.span_id in kept for s in nested[:-1])  # one tree, no orphans
    provider.shutdown()


@pytest.mark.parametrize(("env", "description"), [
    ({}, "ParentBased{root:AlwaysOnSampler"),
    ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
     "ParentBased{root:TraceIdRatioBased{0.25}"),
    ({"OTEL_TRACES_SAMPLER": "always_off"}, "AlwaysOffSampler"),
])
def test_the_sampler_comes_from_the_standard_variables(env: dict[str, str],
                                                       description: str) -> None:
    from tasks.observe.tracing import sampler

    assert sampler(load_settings(env)).get_description().startswith(description)


@pytest.mark.parametrize(("name", "value"), [
    ("TRACING_EXPORTER", "jaeger"),
    ("TRACING_STATEMENTS", "sql,http"),
    ("TRACING_MAX_SPANS", "0"),
    ("OTEL_TRACES_SAMPLER", "sometimes"),
    ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
])
def test_tracing_settings_are_checked(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name) as refused:
        load_settings({name: value})
    assert "\n" not in str(refused.value)


def test_statements_are_parsed_as_a_list() -> None:
    assert load_settings({"TRACING_STATEMENTS": "redis, sql"}).tracing_statements == (
        "sql", "redis")
    assert load_settings({"TRACING_STATEMENTS": "none"}).tracing_statements == ()
    assert load_settings({}).tracing_statements == ()


def test_a_bad_tracing_setting_stops_a_celery_call(worker_env: dict[str, str]) -> None:
    bad = celery_call(dict(worker_env, TRACING_STATEMENTS="everything"), "tasks.health.ping")
    assert bad.returncode != 0 and "TRACING_STATEMENTS" in bad.stderr
