"""The nemesis checker: reads SQL and Redis directly (never through the platform's code paths
it judges) once the platform is quiet, and names each failure with the fault that preceded it.

- rows: every row of `nemesis_rows` processed exactly once (`times = 1`); rows_twice and
  rows_missed list their ids, when they were inserted, their partition's state and the last
  fault before their insert;
- the final range run `succeeded`;
- restock: every SKU's free stock in Redis = total - held - paid (items being reserved
  count as held); no paid order has an item released or restocked (restocked after payment);
  a SKU restocked twice shows as stock above that figure;
- sagas: every ledger is the whole saga or the done steps each undone once, in reverse; a
  wipe takes the ledgers, so the nemesis reads them atomically just before (the checker judges
  what it kept followed by what Redis holds); its journal must be closed (no open owner, no
  pending step);
- workers: every worker answers a ping (restarted by the supervisor if it died).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from sqlalchemy import Engine, func, select, text

from bench.nemesis.job import JOB
from bench.nemesis.ledger import judge
from bench.nemesis.load import SagaSent
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.examples.saga import SAGA_PREFIX
from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS, WORK, RunState
from tasks.restock.keys import stock_key
from tasks.restock.tables import ORDER_ITEMS, PAYMENTS, SKUS, ItemState
from tasks.rollback.tables import JOURNAL, OWNERS, JournalState, OwnerState

__all__ = ["Findings", "check", "FaultLog"]

REOPENED = 5  # a finished partition claimed more often than this keeps being reopened
FaultLog = Sequence[tuple[float, str, str]]  # (seconds after the faults began, kind, detail)


@dataclass
class Findings:
    rows_total: int = 0
    rows_once: int = 0
    rows_twice: int = 0
    rows_missed: int = 0
    final_run: str = "none"
    skus_inconsistent: int = 0
    orders_restocked_after_payment: int = 0
    sagas_judged: int = 0
    sagas_half_done: int = 0
    workers_silent: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (self.rows_twice == self.rows_missed == 0 and self.rows_once == self.rows_total
                and self.final_run == RunState.SUCCEEDED and self.skus_inconsistent == 0
                and self.orders_restocked_after_payment == 0 and self.sagas_half_done == 0
                and not self.workers_silent and not self.problems)


def _before(log: FaultLog, at: float) -> str:
    earlier = [entry for entry in log if entry[0] <= at]
    if not earlier:
        return "no fault before it"
    t, kind, detail = earlier[-1]
    return f"after {kind} at t={t:.1f}s ({detail[:80]})"


def _during(log: FaultLog, start: float, seconds: float = 15.0) -> str:
    """The faults from shortly before `start` to `seconds` after it (a saga's lifetime)."""
    near = [f"{kind} t={t:.1f}s" for t, kind, _ in log if start - 2 <= t <= start + seconds]
    return f"faults around it: {', '.join(near[:5])}" if near else "no fault around it"


def check_rows(engine: Engine, found: Findings, log: FaultLog, began: datetime) -> None:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, times, created_at FROM nemesis_rows "
                                 "ORDER BY id")).all()
        parts = conn.execute(select(WORK.c.part, WORK.c.lo, WORK.c.hi, WORK.c.status,
                                    WORK.c.next_id, WORK.c.claims)
                             .where(WORK.c.job == JOB)).all()
        run = conn.execute(select(RANGE_RUNS.c.id, RANGE_RUNS.c.state).where(
            RANGE_RUNS.c.job == JOB).order_by(RANGE_RUNS.c.id.desc()).limit(1)).first()
    found.rows_total = len(rows)
    found.rows_once = sum(1 for r in rows if r.times == 1)
    found.final_run = f"{run.state}" if run else "none"
    if run is not None and run.state != RunState.SUCCEEDED:
        found.problems.append(f"final run {run.id} is {run.state}, not succeeded")
        found.problems.extend(unfinished(engine, parts))
        found.problems.extend(run_history(engine, run.id))
    for r in rows:
        if r.times == 1:
            continue
        if r.times == 0:
            found.rows_missed += 1
        else:
            found.rows_twice += 1
        at = (r.created_at - began).total_seconds()
        part = next((p for p in parts if p.lo <= r.id <= p.hi), None)
        where = (f"partition {part.part} [{part.lo}..{part.hi}] {part.status} next_id "
                 f"{part.next_id}" if part else "in no partition")
        found.problems.append(f"row {r.id} processed {r.times} times; inserted at t={at:.1f}s, "
                              f"{_before(log, at)}; {where}")


def unfinished(engine: Engine, parts: Sequence[Any]) -> list[str]:
    """Why a run did not end: each partition not finished, with its claims and whether the top
    of its id range exists (deleted or never allocated ids keep a partition reopening)."""
    said = []
    with engine.connect() as conn:
        for p in sorted(parts, key=lambda p: p.part):
            if p.status in ("done", "empty") and p.claims <= REOPENED:
                continue
            top, count = conn.execute(text(
                "SELECT max(id), count(*) FROM nemesis_rows WHERE id BETWEEN :lo AND :hi"),
                {"lo": p.lo, "hi": p.hi}).one()
            said.append(f"partition {p.part} [{p.lo}..{p.hi}] {p.status}, claimed {p.claims} "
                        f"times, next_id {p.next_id}; {count} rows, highest id {top}"
                        + ("" if top == p.hi else f" (ids {(top or p.lo - 1) + 1}..{p.hi} "
                                                  "absent)"))
    return said


def run_history(engine: Engine, run_id: int) -> list[str]:
    """How the final run went: how often it ended and was reopened, and the partitions dead-
    lettered (a lock timeout counted as a crash shows here as "keeps killing its worker")."""
    with engine.connect() as conn:
        counted = conn.execute(select(RANGE_RUN_EVENTS.c.verb, func.count()).where(
            RANGE_RUN_EVENTS.c.run_id == run_id).group_by(RANGE_RUN_EVENTS.c.verb)).all()
        verbs = {str(verb): int(n) for verb, n in counted}
        letters = conn.execute(select(DEAD_LETTERS.c.ref, DEAD_LETTERS.c.reason).where(
            DEAD_LETTERS.c.kind == "range-partition")).all()
    said = [f"run {run_id} events: {dict(sorted(verbs.items()))}"]
    said += [f"dead letter range-partition {ref}: {reason[:160]}" for ref, reason in letters]
    return said


def check_stock(engine: Engine, client: redis.Redis, found: Findings) -> None:
    with engine.connect() as conn:
        skus = conn.execute(select(SKUS)).all()
        by_state = conn.execute(select(ORDER_ITEMS.c.sku_id, ORDER_ITEMS.c.state,
                                       func.sum(ORDER_ITEMS.c.qty))
                                .group_by(ORDER_ITEMS.c.sku_id, ORDER_ITEMS.c.state)).all()
        after_payment = conn.execute(
            select(ORDER_ITEMS.c.order_item_id, ORDER_ITEMS.c.state).join(
                PAYMENTS, PAYMENTS.c.order_id == ORDER_ITEMS.c.order_id)
            .where(ORDER_ITEMS.c.state.in_(ItemState.RETURNED))).all()
    out: dict[str, int] = {}
    for sku_id, state, qty in by_state:
        if state in (ItemState.RESERVING, *ItemState.OUT):
            out[sku_id] = out.get(sku_id, 0) + int(qty)
    for sku in skus:
        raw = client.hget(stock_key(sku.redis_id), sku.sku_id)
        stock = None if raw is None else int(raw)
        expected = sku.total - out.get(sku.sku_id, 0)
        if stock != expected:
            found.skus_inconsistent += 1
            found.problems.append(f"SKU {sku.sku_id}: Redis stock {stock}, expected total "
                                  f"{sku.total} - held - paid = {expected}")
    found.orders_restocked_after_payment = len(after_payment)
    for item_id, state in after_payment:
        found.problems.append(f"order item {item_id} is {state} although its order was paid")


def check_sagas(engine: Engine, client: redis.Redis, sagas: Sequence[SagaSent],
                kept: Mapping[str, list[str]], log: FaultLog, found: Findings) -> None:
    """Each saga's ledger (what wipes took, then what Redis holds; bench/nemesis/ledger.py)
    against how its journal ended; an open journal is a saga half done."""
    with engine.connect() as conn:
        owners = dict(conn.execute(select(OWNERS.c.task_id, OWNERS.c.state)).all())
        pending = set(conn.execute(select(JOURNAL.c.task_id).where(JOURNAL.c.state.in_(
            (*JournalState.PENDING, JournalState.COMPENSATING)))).scalars())
    for saga in sagas:
        found.sagas_judged += 1
        key = f"{SAGA_PREFIX}{saga.order_id}"
        now = [_text(e) for e in client.lrange(key, 0, -1)]  # type: ignore[union-attr]
        before = kept.get(saga.order_id, [])
        state = owners.get(saga.task_id)
        wrong = judge(before, now, compensated=state in OwnerState.CLOSED)
        if state in OwnerState.OPEN or saga.task_id in pending:
            wrong = "its journal is still open"
        if wrong is None:
            continue
        found.sagas_half_done += 1
        how = "revoked" if saga.revoked else "not revoked"
        found.problems.append(f"saga {saga.order_id} (task {saga.task_id}, fail_at "
                              f"{saga.fail_at}, {how}, sent at t={saga.sent_at:.1f}s, journal "
                              f"{state}): {wrong}; ledger {before} before wipes + {now}, "
                              f"{_during(log, saga.sent_at)}")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def check(engine: Engine, redis_url: str, sagas: Sequence[SagaSent],
          kept: Mapping[str, list[str]], log: FaultLog, began: datetime,
          silent: list[str]) -> Findings:
    """Every check above; `silent` are the workers that did not answer a ping."""
    found = Findings(workers_silent=silent)
    for name in silent:
        found.problems.append(f"worker {name} does not answer (gone for good)")
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        check_rows(engine, found, log, began)
        check_stock(engine, client, found)
        check_sagas(engine, client, sagas, kept, log, found)
    finally:
        client.close()
    return found


def summary(found: Findings) -> dict[str, Any]:
    return {"rows_once": found.rows_once, "rows_twice": found.rows_twice,
            "rows_missed": found.rows_missed, "skus_inconsistent": found.skus_inconsistent,
            "sagas_half_done": found.sagas_half_done}
