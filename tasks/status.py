"""`python -m tasks status`: every partition of every range job, and every restock node."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.exceptions import RedisError
from rich.console import Console
from rich.table import Table
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletter import DeadLetters
from tasks.drain import DEAD_LETTER_KIND
from tasks.models import DEAD_LETTERS, WORK
from tasks.stock import (
    delay_key,
    maintaining_key,
    meta_key,
    redo_cursor_key,
    redo_key,
    term_key,
)

__all__ = ["NodeView", "PartitionView", "partitions", "render", "render_letters",
           "render_nodes", "restock_nodes", "RECENT_LETTERS"]

# Dead letters `status` lists (newest first, without payloads); the rest are only counted.
RECENT_LETTERS = 10



@dataclass(frozen=True)
class PartitionView:
    job: str
    part: int
    lo: int
    hi: int
    status: str
    owner: str | None
    checkpoint: int
    rows_done: int
    rows_per_s: float
    fence: int
    claims: int
    error: str | None
    heartbeat_at: datetime | None

    @property
    def takeovers(self) -> int:
        """Claims beyond the first: each one is a handover or a failover."""
        return max(self.claims - 1, 0)


def partitions(sessions: sessionmaker[Session], job: str | None = None) -> list[PartitionView]:
    query = select(WORK).where(WORK.c.kind == "range").order_by(WORK.c.job, WORK.c.part)
    if job is not None:
        query = query.where(WORK.c.job == job)
    with sessions() as session:
        rows = session.execute(query).all()
    return [PartitionView(r.job, r.part, r.lo, r.hi, r.status, r.owner, r.next_id, r.rows_done,
                          r.rate, r.fence, r.claims, r.error, r.heartbeat_at) for r in rows]


def render(views: Sequence[PartitionView], console: Console | None = None) -> None:
    console = console or Console()
    if not views:
        console.print("no range job has partitions yet "
                      "(start one: celery -A tasks call tasks.ranges.start --args '[\"cm_data\"]')")
        return
    table = Table(title="range partitions")
    for column in ("job", "part", "ids", "state", "owner", "checkpoint", "rows done", "rows/s",
                   "fence", "takeovers"):
        table.add_column(column, justify="right" if column not in ("job", "state", "owner")
                         else "left")
    for v in views:
        state = v.status if v.status != "failed" else f"failed: {v.error}"
        table.add_row(v.job, str(v.part), f"{v.lo}..{v.hi}", state, v.owner or "-",
                      str(v.checkpoint), str(v.rows_done), f"{v.rows_per_s:,.0f}", str(v.fence),
                      str(v.takeovers))
    console.print(table)


@dataclass(frozen=True)
class NodeView:
    """One restock Redis node, as `python -m tasks status` shows it."""

    node: int
    term: int | None  # None: the node did not answer
    maintaining: bool
    next_maintain_ms: int | None
    queued: dict[str, int]  # queue -> entries in its delay queue
    due: dict[str, int]  # queue -> entries due now
    backlog: dict[str, int]  # queue -> redo-log entries not yet synced
    dead_letters: int
    error: str | None = None


def restock_nodes(sessions: sessionmaker[Session], nodes: Sequence[Any], queues: Sequence[str],
                  now_ms: int) -> list[NodeView]:
    """Term, maintenance window, queue lengths, due entries and dead letters of every node."""
    per_node = _letters_per_node(sessions, [node.redis_id for node in nodes])
    views = []
    for node in nodes:
        n = node.redis_id
        try:
            with node.client.pipeline(transaction=False) as pipe:
                pipe.get(term_key(n))
                pipe.exists(maintaining_key(n))
                pipe.hget(meta_key(n), "next_maintain_ms")
                for queue in queues:
                    pipe.zcard(delay_key(n, queue))
                    pipe.zcount(delay_key(n, queue), "-inf", now_ms)
                    pipe.xlen(redo_key(n, queue))
                    pipe.hget(redo_cursor_key(n, queue), "id")
                replies = pipe.execute()
        except (RedisError, OSError) as exc:
            views.append(NodeView(n, None, False, None, {}, {}, {}, per_node.get(n, 0),
                                  f"{type(exc).__name__}: {exc}"))
            continue
        term, maintaining, next_ms, rest = replies[0], replies[1], replies[2], replies[3:]
        queued, due, backlog = {}, {}, {}
        for i, queue in enumerate(queues):
            size, due_now, log_len, cursor = rest[4 * i:4 * i + 4]
            queued[queue], due[queue] = int(size), int(due_now)
            backlog[queue] = _unsynced(node.client, redo_key(n, queue), cursor, int(log_len))
        views.append(NodeView(n, int(term or 0), bool(maintaining),
                              None if next_ms is None else int(next_ms), queued, due, backlog,
                              per_node.get(n, 0)))
    return views


def _letters_per_node(sessions: sessionmaker[Session], node_ids: Sequence[int]
                      ) -> dict[int, int]:
    """Restock dead letters per node, counted by the database: no payload is loaded.

    The node is only in the JSON payload, written with sorted keys, so `"node": N, "queue"`
    appears exactly once in a letter of node N (a quote inside a JSON string is escaped, so an
    entry's text cannot imitate it).
    """
    d = DEAD_LETTERS.c
    counts = [func.sum(case((d.payload.like(f'%"node": {n}, "queue"%'), 1), else_=0))
              for n in node_ids]
    if not counts:
        return {}
    with sessions() as session:
        row = session.execute(select(*counts).where(d.kind == DEAD_LETTER_KIND)).one()
    return {n: int(c or 0) for n, c in zip(node_ids, row, strict=True)}


def _unsynced(client: Any, stream: str, cursor: bytes | None, length: int) -> int:
    """Redo-log entries after the sync cursor (the log keeps synced entries until trimmed)."""
    if cursor is None:
        return length
    after = client.xrange(stream, min=b"(" + cursor, max="+", count=10_001)
    return len(after)


def render_nodes(views: Sequence[NodeView], now_ms: int, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="restock nodes")
    for column in ("node", "term", "maintenance", "queue", "queued", "due", "unsynced log",
                   "dead letters"):
        table.add_column(column, justify="left" if column in ("maintenance", "queue")
                         else "right")
    for v in views:
        if v.error is not None:
            table.add_row(str(v.node), "-", f"unreachable: {v.error}", "-", "-", "-", "-",
                          str(v.dead_letters))
            continue
        if v.maintaining:
            window = "in maintenance now"
        elif v.next_maintain_ms is None:
            window = "never rebuilt: due now"
        else:
            window = f"next in {max(v.next_maintain_ms - now_ms, 0) / 1000:,.0f}s"
        for i, queue in enumerate(v.queued):
            first = i == 0
            table.add_row(str(v.node) if first else "", str(v.term) if first else "",
                          window if first else "", queue, str(v.queued[queue]),
                          str(v.due[queue]), str(v.backlog[queue]),
                          str(v.dead_letters) if first else "")
    console.print(table)


def render_letters(sessions: sessionmaker[Session], console: Console | None = None) -> None:
    """Dead letters: a count per kind (SQL), and the newest few without their payloads."""
    console = console or Console()
    letters = DeadLetters(sessions)
    counts = letters.counts()
    if not counts:
        console.print("no dead letters")
        return
    total = sum(counts.values())
    console.print(f"dead letters: {total:,} ("
                  + ", ".join(f"{kind}: {n:,}" for kind, n in sorted(counts.items())) + ")")
    table = Table(title=f"newest {min(total, RECENT_LETTERS)} dead letters")
    for column in ("id", "kind", "ref", "created (UTC)", "reason"):
        table.add_column(column)
    for letter in letters.recent(RECENT_LETTERS):
        table.add_row(str(letter.id), letter.kind, quote_text(letter.ref),
                      f"{letter.created_at:%Y-%m-%d %H:%M:%S}", quote_text(letter.reason, 120))
    console.print(table)


def quote_text(text: str, limit: int = 48) -> str:
    """`text` cut to `limit` characters (a ref or reason may quote a long bad value)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"
