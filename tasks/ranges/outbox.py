"""The hooks' outbox: how each run end's hook (`tasks.ranges.hooks`) runs once.

Exactly once per run end, by an outbox on the run row:

    t0  the transaction that ends the run (the closing round, `cancel`) also sets
        `range_runs.hook` to the end state (runs.change_state)
    t1  a reconcile task (beat's, every RECONCILE_INTERVAL) finds the owed hook and claims
        it: `UPDATE ... SET hook_task = :new_id WHERE hook_task IS :seen` (one claimer wins),
        then sends `tasks.ranges.hook(run, state)` with that task id
    t2  the hook task runs the hook only while `hook_task` is its own id (a Celery retry
        keeps its id); once the hook returned it clears `hook` in one compare-and-set
        and records `hook` on the run

A worker killed anywhere leaves the hook owed: killed before t1 or between the claim and the
send, or while the hook runs, the message (or its absence) is found again once `hook_sent_at`
is RANGE_HOOK_RESEND seconds old, and sent again under a new task id, which also retires the
old one. So the message is delivered at least once and the hook *completes* once; a hook
whose own effect landed just before its worker died (before t2 committed) runs again. Its
summary carries the run's global id (`id`) and its number in the job (`run`): a hook with an
effect outside this database keys it by either (with the job, for the number). A run that a
retry (`retry-failed`, `retry-skipped`) sets running again owes a hook again when it ends
again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.hooks import HOOK_RETRY, HOOKS, call
from tasks.ranges.runs import Run, record, run_of, writing
from tasks.ranges.tables import RANGE_RUNS
from tasks.store.db import affected, utcnow
from tasks.worker.retry import decide

__all__ = ["summary", "Owed", "owed", "claim", "deliver", "Claimed", "take", "settle",
           "new_task_id", "run_hook", "Again"]

log = logging.getLogger("tasks.ranges")


def summary(run: Run, state: str) -> dict[str, Any]:
    """What a hook is given: the run as `jobs runs --json` shows it, and which hook runs."""
    return {**run.as_dict(), "state": state, "hook": HOOKS[state]}


def new_task_id(run_id: int) -> str:
    return f"range-hook-{run_id}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Owed:
    """A run whose hook is owed: its end state, and the hook message that claimed it last."""

    run_id: int
    job: str
    state: str
    task: str | None


def owed(sessions: sessionmaker[Session], resend: float, limit: int = 100,
         now: datetime | None = None) -> list[Owed]:
    """Runs whose hook is owed and not sent (or sent, or last tried, `resend` seconds ago):
    one indexed read of `range_runs.hook`."""
    stale = (now or utcnow()) - timedelta(seconds=resend)
    with sessions() as session:
        rows = session.execute(select(RANGE_RUNS.c.id, RANGE_RUNS.c.job, RANGE_RUNS.c.hook,
                                      RANGE_RUNS.c.hook_task).where(
            RANGE_RUNS.c.hook.is_not(None),
            or_(RANGE_RUNS.c.hook_task.is_(None), RANGE_RUNS.c.hook_sent_at < stale))
            .order_by(RANGE_RUNS.c.id).limit(limit)).all()
    return [Owed(int(r.id), r.job, r.hook, r.hook_task) for r in rows]


def claim(sessions: sessionmaker[Session], found: Owed, task_id: str | None) -> bool:
    """Make `task_id` the owner of the run's owed hook, if nobody claimed it since `found`
    was read (two reconcile tasks at once send it once); `task_id` None: nothing is owed
    after all (the job declares no hook for that end), the outbox is cleared; "": the
    claim of `found.task` is given back (its send failed)."""
    seen = (RANGE_RUNS.c.hook_task.is_(None) if found.task is None
            else RANGE_RUNS.c.hook_task == found.task)
    values: dict[str, Any] = {"hook_task": task_id, "hook_sent_at": utcnow()}
    if task_id is None:
        values = {"hook": None, "hook_task": None, "hook_sent_at": None}
    elif not task_id:  # a claim whose send failed is given back
        values = {"hook_task": None, "hook_sent_at": None}
    with writing(sessions) as session:
        return affected(session.execute(update(RANGE_RUNS).where(
            RANGE_RUNS.c.id == found.run_id, RANGE_RUNS.c.hook == found.state, seen)
            .values(**values))) == 1


# Sends the hook message of (run id, end state) under a task id.
Send = Callable[[int, str, str], None]
# Whether a job (by name) declares a hook for an end state.
Declared = Callable[[str, str], bool]


def deliver(sessions: sessionmaker[Session], send: Send, resend: float,
            declared: Declared) -> list[int]:
    """Claim and send every owed hook (a reconcile task's last step); the runs sent. A run
    whose job declares no hook for its end only has its outbox cleared."""
    sent = []
    for found in owed(sessions, resend):
        if not declared(found.job, found.state):
            claim(sessions, found, None)
            continue
        task_id = new_task_id(found.run_id)
        if not claim(sessions, found, task_id):
            continue
        try:
            send(found.run_id, found.state, task_id)
        except Exception as exc:  # the broker is away: the next reconcile task sends it
            log.warning("range %s run %d: hook not sent (%s); trying again next round",
                        found.job, found.run_id, type(exc).__name__)
            claim(sessions, Owed(found.run_id, found.job, found.state, task_id), "")
            continue
        sent.append(found.run_id)
    if sent:
        log.info("range hooks: sent the hooks of runs %s", sent[:20])
    return sent


@dataclass(frozen=True)
class Claimed:
    """An owed hook its task may run: the run as it ended."""

    run: Run
    state: str


def take(sessions: sessionmaker[Session], run_id: int, state: str,
         task_id: str) -> Claimed | None:
    """The run, if its `state` hook is owed and `task_id` owns it (None: done already, or
    another message owns it); its `hook_sent_at` moves to now (this attempt)."""
    with writing(sessions) as session:
        mine = affected(session.execute(update(RANGE_RUNS).where(
            RANGE_RUNS.c.id == run_id, RANGE_RUNS.c.hook == state,
            RANGE_RUNS.c.hook_task == task_id).values(hook_sent_at=utcnow()))) == 1
    if not mine:
        return None
    run = run_of(sessions, run_id)
    return Claimed(run, state) if run is not None else None


def settle(sessions: sessionmaker[Session], claimed: Claimed, task_id: str, verb: str,
           detail: str) -> bool:
    """The hook ran (`verb` "hook") or was given up ("hook-failed"): clear the outbox and
    record it on the run, in one transaction, if `task_id` still owns it."""
    run = claimed.run
    with writing(sessions) as session:
        done = affected(session.execute(update(RANGE_RUNS).where(
            RANGE_RUNS.c.id == run.id, RANGE_RUNS.c.hook == claimed.state,
            RANGE_RUNS.c.hook_task == task_id)
            .values(hook=None, hook_task=None, hook_sent_at=None))) == 1
        if done:
            record(session, run.id, run.job, verb, f"task:{task_id}", detail)
    return done


class Again(Exception):
    """The hook raised and HOOK_RETRY gives it another try in `countdown` seconds (the
    hook's exception is the cause)."""

    def __init__(self, countdown: float) -> None:
        super().__init__(f"retry in {countdown:.1f}s")
        self.countdown = countdown


def run_hook(sessions: sessionmaker[Session], app: Any, hook_of: Callable[[str, str], Any],
             run_id: int, state: str, task_id: str, retries: int) -> dict[str, Any]:
    """The body of `tasks.ranges.hook`: run the hook of run `run_id` (ended in `state`) if
    the message `task_id` owns it; `retries` tries were made before. `Again` when it raised
    and may be tried again; the hook's own exception when it is given up (recorded)."""
    claimed = take(sessions, run_id, state, task_id)
    if claimed is None:
        return {"run": run_id, "state": state, "outcome": "not owed"}
    declared = hook_of(claimed.run.job, claimed.state)
    name = HOOKS[claimed.state]
    try:
        done = "none declared" if declared is None else call(
            app, declared, summary(claimed.run, claimed.state))
    except Exception as exc:
        countdown = decide(HOOK_RETRY, exc, retries)
        if countdown is None:
            settle(sessions, claimed, task_id, "hook-failed",
                   f"{name} failed after {retries + 1} tries: {type(exc).__name__}: "
                   f"{' '.join(str(exc).split())[:300]}")
            raise
        log.warning("range %s run %d: %s raised %s; retrying in %.1fs", claimed.run.job,
                    claimed.run.id, name, type(exc).__name__, countdown)
        raise Again(countdown) from exc
    settle(sessions, claimed, task_id, "hook", f"{name}: {done}")
    return {"run": run_id, "state": state, "outcome": "ran", "hook": name, "done": done}
