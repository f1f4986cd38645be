"""Who may do what in the console: the two roles, and the controls a job's current state
allows.

- `viewer` reads every page and every answer of the API and changes nothing: every request
  that is not a GET needs `operator` unless its handler says otherwise (logout, a dry run),
  enforced in `tasks.console.auth.ConsoleHandler.prepare`.
- `operator` has every control, but only those the run's state allows (`allowed`): the job
  API sends the list and the job page shows exactly those buttons, so the rule lives here
  and nowhere in the page. The platform checks the state again on every control (a run that
  changed in between is refused with its reason); this list only keeps buttons that would be
  refused off the page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["VIEWER", "OPERATOR", "ROLES", "may", "allowed"]

VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)  # least first: a role may what every role before it may

# The run states (tasks.ranges.tables.RunState, spelled as the job API writes them).
_RUNNING, _PAUSED, _FOLLOWING, _FAILED = "running", "paused", "following", "failed"
_LIVE = (_RUNNING, _PAUSED, _FOLLOWING)


def may(role: str | None, needed: str) -> bool:
    """Whether `role` has what `needed` gives (an unknown role has nothing)."""
    if role not in ROLES:
        return False
    return ROLES.index(role) >= ROLES.index(needed)


def allowed(summary: Mapping[str, Any], role: str | None) -> list[str]:
    """The job controls (`tasks.console.actions.VERBS`) `role` may use on a job whose summary
    (the job API's `job`) is `summary`, in VERBS order: none for a viewer.

    start: no run is live; pause: running; resume: paused; cancel and throttle: live
    (running, paused or following); retry-failed: the run is live or failed and has failed
    partitions; retry-skipped: the run has skipped rows."""
    if not may(role, OPERATOR):
        return []
    has_run = summary.get("run") is not None
    state = str(summary.get("state", "")) if has_run else ""
    live = state in _LIVE
    failed = int((summary.get("partitions") or {}).get("failed", 0) or 0)
    rules = {
        "start": not live,
        "pause": state == _RUNNING,
        "resume": state == _PAUSED,
        "cancel": live,
        "retry-failed": (live or state == _FAILED) and failed > 0,
        "retry-skipped": has_run and int(summary.get("rows_skipped") or 0) > 0,
        "throttle": live,
    }
    return [verb for verb, ok in rules.items() if ok]
