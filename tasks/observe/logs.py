"""Worker and beat log lines: Celery's text format, or with LOG_FORMAT=json one JSON object per
line (python-json-logger's formatter) carrying the task id and name and, where they apply, the
job, partition, fence and stock node of the work the line is about.

The wings say what they work on with `bind(job=..., partition=..., fence=...)` around it; a
filter on every handler copies the bound fields and the current Celery task onto each record
(they are context variables, so each pool process and thread sees its own).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

__all__ = ["bind", "bound", "on_bind", "use_json", "ContextFields", "FIELDS"]

FIELDS = ("task_id", "task_name", "job", "partition", "fence", "node")
_NOTHING: Mapping[str, Any] = MappingProxyType({})
_bound: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "rangekeeper_log", default=_NOTHING)


_hooks: list[Callable[[Mapping[str, Any]], None]] = []


def on_bind(hook: Callable[[Mapping[str, Any]], None]) -> None:
    """Call `hook(fields)` at each `bind` (tracing sets them on the current span)."""
    if hook not in _hooks:
        _hooks.append(hook)


def bound() -> Mapping[str, Any]:
    """The fields bound here now."""
    return _bound.get()


@contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add `fields` (job, partition, fence, node) to every log record made inside the block."""
    token = _bound.set({**_bound.get(), **fields})
    for hook in _hooks:
        hook(fields)
    try:
        yield
    finally:
        _bound.reset(token)


class ContextFields(logging.Filter):
    """Puts the current task and the bound fields on each record (absent ones left out)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from celery import current_task

        task = current_task
        if task is not None and getattr(task, "request", None) is not None and task.request.id:
            record.task_id = task.request.id
            record.task_name = task.name
        for name, value in _bound.get().items():
            setattr(record, name, value)
        return True


def use_json(logger: logging.Logger) -> None:
    """Switch every handler of `logger` to one JSON object per line."""
    from pythonjsonlogger.json import JsonFormatter

    formatter = JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(processName)s %(message)s",
        rename_fields={"levelname": "level", "asctime": "time", "processName": "process"},
        timestamp=False,
    )
    for handler in logger.handlers:
        handler.setFormatter(formatter)
        if not any(isinstance(f, ContextFields) for f in handler.filters):
            handler.addFilter(ContextFields())
