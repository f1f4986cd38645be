"""Hooks of range jobs: what runs when a run ends (`on_success`, `on_failure`, `on_cancel`).

    RangeJob(..., on_success=signature("tasks.ranges.start", args=["next_job"], immutable=True),
                  on_failure=notify_channel)     # notify_channel(run: dict) -> None

A hook is a plain callable, called with the run's summary (`summary`: job, run, state, rows,
params, times, hook) inside the task `tasks.ranges.hook`; or a Celery signature (or a task name,
or a signature's dict form `{"task": ..., "args": [...], "kwargs": {...}}`), which that task
sends, with the summary as its first argument unless the signature is immutable (Celery's
rule for a link callback: `.s()` receives it, `.si()` does not). A hook that raises is retried
with HOOK_RETRY; one that still fails is recorded on the run (`hook-failed`, with its error)
and given up.

Delivery, exactly once per run end: `tasks.ranges.outbox`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from celery import Celery, Signature
from celery import signature as make_signature

from tasks.ranges.tables import RunState
from tasks.worker.retry import RetryPolicy

__all__ = ["HOOKS", "HOOK_RETRY", "Hook", "validate_hook", "call"]

# The end state -> the RangeJob field that names its hook.
HOOKS = {RunState.SUCCEEDED: "on_success", RunState.FAILED: "on_failure",
         RunState.CANCELLED: "on_cancel"}

# A hook that raises: 5 more tries, 1 s doubling to 60 s (jittered), then it is given up.
HOOK_RETRY = RetryPolicy(max_retries=5, initial_interval=1.0, max_interval=60.0)

TASK_NAME_LIMIT = 255

# What a job declares: a callable, or a signature (its dict form, or a task name).
Hook = Callable[[dict[str, Any]], object] | Signature | dict[str, Any] | str


def validate_hook(job: str, field: str, hook: object) -> Callable[..., object] | Signature | None:
    """The declared `hook` in the form the hook task uses (a callable or a Signature);
    ValueError naming the job and the field otherwise."""
    if hook is None:
        return None
    where = f"range job {job}: {field}"
    if isinstance(hook, str | dict) and not isinstance(hook, Signature):
        name = hook if isinstance(hook, str) else hook.get("task")
        if not isinstance(name, str):
            raise ValueError(f"{where}: a hook given as a dict needs a task name under "
                             f"'task', got {hook!r:.80}")
        hook = make_signature(hook)
        if not name or len(name) > TASK_NAME_LIMIT or any(c.isspace() for c in name):
            raise ValueError(f"{where}: {name!r:.80} is not a task name")
    if isinstance(hook, Signature):
        if not isinstance(hook.get("task"), str) or not hook["task"]:
            raise ValueError(f"{where}: the signature names no task")
        try:
            json.dumps({"args": list(hook.args), "kwargs": dict(hook.kwargs),
                        "options": dict(hook.options)})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: the signature of {hook['task']} must be JSON-"
                             f"serialisable ({exc})") from None
        return hook
    if callable(hook):
        return hook
    raise ValueError(f"{where} must be a callable (called with the run's summary), a Celery "
                     f"signature or a task name, got {type(hook).__name__}")


def call(app: Celery, hook: Callable[..., object] | Signature, run: dict[str, Any]) -> str:
    """Run a callable hook here, or send a signature hook (the summary first unless it is
    immutable); what was done, for the run's record."""
    if isinstance(hook, Signature):
        sig = hook.clone() if hook.immutable else hook.clone(args=(run,))
        sig.app = app
        sent = sig.apply_async()
        return f"sent {hook['task']} as task {sent.id}"
    hook(run)
    return f"called {getattr(hook, '__qualname__', type(hook).__name__)}"

