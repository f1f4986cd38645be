"""After the faults: heal everything, then wait (bounded) until the platform is quiet.

Heal: every held fault has undone itself (the nemesis waited), the load stopped; the proxy
forwards again, every process is continued and running (the supervisor restarted the dead),
Redis answers; the range job is resumed, a new run started if the last one ended (so the final
run covers every row) and its throttle lifted; an order left `reserving` (its place_order lost
in a fault) is placed again, as the application retries it.

Quiet: the final run ended, no order item reserving, held or released, no saga journal open.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Engine, func, select

from bench.nemesis.faults import Nemesis
from bench.nemesis.fleet import Supervisor
from bench.nemesis.job import JOB
from bench.nemesis.load import Load
from tasks.ranges.tables import RANGE_RUNS, RunState
from tasks.restock.tables import ORDER_ITEMS, ItemState
from tasks.rollback.tables import JOURNAL, OWNERS, JournalState, OwnerState

__all__ = ["heal", "quiet", "wait_quiet", "silent_workers", "replace_stuck_orders"]

NUDGE_S = 10.0  # seconds between the application's retries of unsettled orders


def heal(nemesis: Nemesis, load: Load, engine: Engine) -> None:
    nemesis.stop()
    nemesis.wait()
    load.stop()
    nemesis.proxy.heal()
    supervisor = nemesis.supervisor
    for name in supervisor.members:
        supervisor.kill_group(name, signal.SIGCONT)
    down = supervisor.wait_all_up(30)
    if down:
        print(f"  heal: still down after 30 s: {down}", flush=True)
    _redis_up(nemesis)
    for verb in ("resume", "start"):
        print(f"  heal: {nemesis.jobs(verb)}", flush=True)
    print(f"  heal: {nemesis.jobs('throttle', '0')}", flush=True)
    replace_stuck_orders(load, engine)


def _redis_up(nemesis: Nemesis) -> None:
    client = redis.Redis(port=nemesis.redis_proc.port, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        print("  heal: Redis does not answer; restarting it", flush=True)
        nemesis.redis_proc.restart_empty()
    finally:
        client.close()


def replace_stuck_orders(load: Load, engine: Engine) -> None:
    """Place again every order the application recorded that is reserving or absent (what
    an application does when place_order did not answer), printing what each retry said."""
    with engine.connect() as conn:
        counted = conn.execute(select(ORDER_ITEMS.c.order_id, func.count()).where(
            ORDER_ITEMS.c.state != ItemState.RESERVING).group_by(ORDER_ITEMS.c.order_id)).all()
    known = {str(order): int(n) for order, n in counted}
    stuck = [o for o, (_, items) in load.orders.items() if known.get(o, 0) < len(items)]
    said: dict[str, str] = {}
    load.renew()
    sent = {order_id: _send_order(load, order_id) for order_id in stuck}
    deadline = time.monotonic() + 20
    for order_id, result in sent.items():
        try:
            result.get(timeout=max(deadline - time.monotonic(), 0.1))
            said[order_id] = "placed"
        except Exception as exc:  # noqa: BLE001 - the application retries it next round
            said[order_id] = f"{type(exc).__name__}: {str(exc)[:80]}"
    if stuck:
        print(f"  heal: placed again {len(stuck)} order(s) stuck or never recorded: {said}",
              flush=True)


def _send_order(load: Load, order_id: str, tries: int = 5) -> Any:
    """Send place_order again; after a failure, again on a fresh client: a client whose
    result consumer met a reset or a stalled Redis gives up for good ("must be restarted")."""
    for tried in range(1, tries + 1):
        try:
            return load.client.send_task("tasks.restock.place_order",
                                         args=[order_id, *load.orders[order_id]])
        except Exception:  # noqa: BLE001 - Redis still settling after the faults
            if tried == tries:
                raise
            time.sleep(1.0)
            load.renew()
    raise AssertionError("unreachable")


def quiet(engine: Engine) -> str | None:
    """None when the platform is quiet; otherwise what it still does."""
    with engine.connect() as conn:
        run = conn.execute(select(RANGE_RUNS.c.state).where(RANGE_RUNS.c.job == JOB)
                           .order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar()
        items = conn.execute(select(func.count()).where(ORDER_ITEMS.c.state.in_(
            (ItemState.RESERVING, ItemState.HELD, ItemState.RELEASED)))).scalar()
        owners = conn.execute(select(func.count()).where(
            OWNERS.c.state.in_(OwnerState.OPEN))).scalar()
        pending = conn.execute(select(
            JOURNAL.c.task_id, JOURNAL.c.seq, JOURNAL.c.name, JOURNAL.c.state,
            JOURNAL.c.attempt, OWNERS.c.state.label("owner_state"))
            .outerjoin(OWNERS, OWNERS.c.task_id == JOURNAL.c.task_id)
            .where(JOURNAL.c.state.in_((*JournalState.PENDING, JournalState.COMPENSATING)))
            .limit(5)).all()
        steps = conn.execute(select(func.count()).where(JOURNAL.c.state.in_(
            (*JournalState.PENDING, JournalState.COMPENSATING)))).scalar()
    waiting = []
    if run not in RunState.ENDED:
        waiting.append(f"run {run}")
    if items:
        waiting.append(f"{items} order items unsettled")
    if owners or steps:
        waiting.append(f"{owners} saga journals open, {steps} steps pending")
    for r in pending:  # the task id finds the story in the workers' logs
        waiting.append(f"step {r.task_id}:{r.seq} {r.name} {r.state} (attempt {r.attempt}, "
                       f"journal {r.owner_state or 'without owners row'})")
    return ", ".join(waiting) or None


def wait_quiet(engine: Engine, timeout: float, hold: float,
               nudge: Callable[[], None]) -> tuple[float, str | None]:
    """Seconds until quiet (and quiet for `hold` seconds more: an ended run that a reconcile
    round reopens is not quiet), and what was still going on if the bound ran out. `nudge`
    (the application's retries) runs every NUDGE_S while orders are unsettled."""
    began = time.monotonic()
    since: float | None = None
    nudged = began
    last: str | None = "not checked"
    while time.monotonic() - began < timeout:
        last = quiet(engine)
        now = time.monotonic()
        if last is not None:
            since = None
            if "order items" in last and now - nudged > NUDGE_S:
                nudge()
                nudged = time.monotonic()
        elif since is None:
            since = now
        elif now - since >= hold:
            return since - began, None
        time.sleep(0.5)
    return time.monotonic() - began, last


def silent_workers(supervisor: Supervisor, broker_url: str, timeout: float = 20) -> list[str]:
    """The workers that do not answer a ping within `timeout` (through Redis directly)."""
    names = [n for n, m in supervisor.members.items() if m.kind != "beat"]
    client = Celery(broker=broker_url, set_as_current=False)
    answered: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and len(answered) < len(names):
            replies: list[dict[str, Any]] = client.control.ping(timeout=2) or []
            for reply in replies:
                answered |= {n for n in names for host in reply if host.startswith(f"{n}@")}
    finally:
        client.close()
    return sorted(set(names) - answered)

