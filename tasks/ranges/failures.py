"""What a failed partition leaves in its run's history: a `partition-failed` event
(`range_run_events`) with the error and its traceback, written in the transaction that marks
the partition failed, so `python -m tasks jobs runs JOB` and `jobs run JOB N` show why a run
failed after its partitions were retried or a later run reset them.

A traceback is bounded (TRACEBACK_LIMIT characters): its head (where it entered the job) and
its tail (the error and the frames that raised it) are kept, the middle of a deep stack is
cut with a note saying how much.
"""

from __future__ import annotations

import traceback

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from tasks.ranges.tables import RANGE_RUN_EVENTS, RANGE_RUNS
from tasks.store.db import utcnow

__all__ = ["FAILED_VERB", "TRACEBACK_LIMIT", "traceback_of", "record_failure", "first_line"]

FAILED_VERB = "partition-failed"
TRACEBACK_LIMIT = 8000  # characters of a traceback kept on the event
_HEAD = 1500  # of them, from its start; the rest from its end


def traceback_of(exc: BaseException) -> str:
    """`exc`'s traceback as Python prints it, at most TRACEBACK_LIMIT characters."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    if len(text) <= TRACEBACK_LIMIT:
        return text
    cut = len(text) - TRACEBACK_LIMIT + 60
    tail = TRACEBACK_LIMIT - _HEAD - 60
    return f"{text[:_HEAD]}\n  ... ({cut:,} characters cut) ...\n{text[-tail:]}"


def record_failure(session: Session, job: str, part: int, actor: str, reason: str,
                   trace: str | None = None) -> None:
    """Add `part`'s failure to the job's latest run's events (in the caller's transaction):
    the first line is `part N: reason`, the traceback (if any) follows."""
    run_id = session.execute(select(RANGE_RUNS.c.id).where(RANGE_RUNS.c.job == job)
                             .order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar()
    if run_id is None:  # reconciled without a run: the work row's error is the record
        return
    detail = f"part {part}: {reason}" + (f"\n{trace}" if trace else "")
    session.execute(insert(RANGE_RUN_EVENTS).values(
        run_id=run_id, job=job, verb=FAILED_VERB, actor=actor[:255], detail=detail,
        at=utcnow()))


def first_line(detail: str | None) -> str | None:
    """An event's detail as one line (a failure's without its traceback)."""
    if detail is None:
        return None
    line = detail.split("\n", 1)[0]
    return line if len(line) <= 300 else line[:297] + "..."


def failure_dict(at: str | None, actor: str, detail: str | None) -> dict[str, object]:
    """A `partition-failed` event as JSON-able values: the partition, its error, the
    traceback (None: none was kept, a poison partition), who failed it and when."""
    head, _, trace = (detail or "").partition("\n")
    part_text, _, error = head.partition(": ")
    part = part_text.removeprefix("part ")
    return {"part": int(part) if part.isdigit() else None, "error": error or head,
            "traceback": trace or None, "by": actor, "at": at}
