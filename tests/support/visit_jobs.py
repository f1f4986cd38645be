"""Test-only visit-once range jobs (issue 21; EXTRA_TASK_MODULES names this module).

`cm_export` copies each row of `cm_data` it visits into `visit_export` with the run's id and
its holder's fence, in the batch's transaction, and changes nothing in `cm_data`: a test counts
the copies per (run, row). `cm_notify` sends the idempotency keys of its batch to a fake
external service (`VISIT_SINK_URL`, a small HTTP server in the test, `tests.support.sink`)
before its transaction commits. Collections: `csv_copy` copies each line of its run's CSV
(its `name` field as the note), `api_copy` each item of a paginated fake API
(`VISIT_API_URL`, `tests.support.sink.fake_api`), into `visit_export` the same way.

Holding a batch in flight (so a test kills its holder at a known point, never racing it): while
the file `VISIT_HOLD_FILE` exists, a batch whose first row id is above `VISIT_HOLD_AFTER` does
its work, writes `VISIT_HOLD_FILE.held` (the ids of its rows) and waits before it returns
(before its transaction commits).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Column, Engine, Integer, MetaData, String, Table, insert

from examples.tables import CM_DATA
from tasks.ranges.collections import CsvRow, collection_job, csv_job
from tasks.ranges.jobs import Context, RangeJob, register

__all__ = ["VISIT_EXPORT", "recreate", "cm_export", "cm_notify", "csv_copy", "api_copy"]

METADATA = MetaData()

VISIT_EXPORT = Table(
    "visit_export", METADATA,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("source_id", BigInteger, nullable=False),
    Column("run", Integer, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("note", String(64), nullable=True),
)

DELAY = float(os.environ.get("VISIT_BATCH_DELAY") or 0)
SINK = os.environ.get("VISIT_SINK_URL", "")
API = os.environ.get("VISIT_API_URL", "")
HOLD = os.environ.get("VISIT_HOLD_FILE", "")
HOLD_AFTER = int(os.environ.get("VISIT_HOLD_AFTER") or 0)


def recreate(engine: Engine) -> None:
    """`visit_export`, dropped and made anew (the test databases outlive a test)."""
    METADATA.drop_all(engine, checkfirst=True)
    METADATA.create_all(engine)


def _hold(ids: list[int]) -> None:
    """Wait while the hold file exists, if this batch is one to hold (see the docstring)."""
    if not HOLD or not ids or ids[0] <= HOLD_AFTER or not os.path.exists(HOLD):
        return
    with open(f"{HOLD}.held", "w") as marker:
        marker.write(json.dumps(ids))
    while os.path.exists(HOLD):
        time.sleep(0.05)


def _export(rows: Sequence[Any], ctx: Context) -> None:
    time.sleep(DELAY)
    ctx.session.execute(insert(VISIT_EXPORT), [
        {"source_id": r.id, "run": ctx.run, "fence": ctx.fence} for r in rows])
    _hold([r.id for r in rows])


def _notify(rows: Sequence[Any], ctx: Context) -> None:
    body = json.dumps({"keys": [ctx.idempotency_key(r) for r in rows]}).encode()
    request = urllib.request.Request(SINK, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 (the test's URL)
        reply.read()
    time.sleep(DELAY)
    _hold([r.id for r in rows])  # a kill now leaves keys sent and the batch uncommitted


def _copy_lines(rows: Sequence[CsvRow], ctx: Context) -> None:
    ctx.session.execute(insert(VISIT_EXPORT), [
        {"source_id": r.line, "run": ctx.run, "fence": ctx.fence, "note": r.values["name"]}
        for r in rows])
    _hold([r.line for r in rows])


def _api_pages(cursor: Any, size: int) -> tuple[list[dict[str, Any]], Any]:
    """The fake API's page after `cursor` ({"after": id}; None: the first)."""
    after = cursor["after"] if cursor else 0
    with urllib.request.urlopen(f"{API}?after={after}&size={size}",  # noqa: S310
                                timeout=10) as reply:
        page = json.loads(reply.read())
    return page["items"], ({"after": page["next"]} if page["next"] is not None else None)


def _copy_items(items: Sequence[dict[str, Any]], ctx: Context) -> None:
    ctx.session.execute(insert(VISIT_EXPORT), [
        {"source_id": i["id"], "run": ctx.run, "fence": ctx.fence,
         "note": ctx.idempotency_key(i["id"])} for i in items])
    _hold([i["id"] for i in items])


cm_export = register(RangeJob(
    name="cm_export", table=CM_DATA, visits="once", process=_export, columns=("id",),
    partition_size=1000, batch_size=100))

cm_notify = register(RangeJob(
    name="cm_notify", table=CM_DATA, visits="once", process=_notify, columns=("id",),
    partition_size=1000, batch_size=100))

csv_copy = register(csv_job(name="csv_copy", process=_copy_lines, batch_size=500,
                            partition_size=2500))

api_copy = register(collection_job(name="api_copy", pages=_api_pages, process=_copy_items,
                                   batch_size=100))
