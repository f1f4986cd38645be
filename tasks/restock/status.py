"""The restock status view, plain data: every shard's term, window, queues and dead letters. The
CLI draws it (`tasks.cli.render`), `python -m tasks status --json` and the console serialise it
(`shards_json`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, sessionmaker

from tasks.deadletters.tables import DEAD_LETTERS
from tasks.restock.drain import DEAD_LETTER_KIND
from tasks.restock.keys import (
    delay_key,
    maintaining_key,
    meta_key,
    redo_cursor_key,
    redo_key,
    term_key,
)

__all__ = ["ShardView", "shard_views", "shards_json"]


@dataclass(frozen=True)
class ShardView:
    """One restock Redis shard, as `python -m tasks status` shows it."""

    shard: int
    term: int | None  # None: the shard did not answer
    maintaining: bool
    next_maintain_ms: int | None
    queued: dict[str, int]  # queue -> entries in its delay queue
    due: dict[str, int]  # queue -> entries due now
    backlog: dict[str, int]  # queue -> redo-log entries not yet synced
    dead_letters: int
    error: str | None = None

    def window(self, now_ms: int) -> str:
        """The maintenance window as text: now, never rebuilt, or the seconds to the next."""
        if self.maintaining:
            return "in maintenance now"
        if self.next_maintain_ms is None:
            return "never rebuilt: due now"
        return f"next in {max(self.next_maintain_ms - now_ms, 0) / 1000:,.0f}s"


def shard_views(sessions: sessionmaker[Session], shards: Sequence[Any], queues: Sequence[str],
                now_ms: int) -> list[ShardView]:
    """Term, maintenance window, queue lengths, due entries and dead letters of every shard."""
    per_shard = _letters_per_shard(sessions, [shard.number for shard in shards])
    views = []
    for shard in shards:
        n = shard.number
        try:
            with shard.client.pipeline(transaction=False) as pipe:
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
            views.append(ShardView(n, None, False, None, {}, {}, {}, per_shard.get(n, 0),
                                  f"{type(exc).__name__}: {exc}"))
            continue
        term, maintaining, next_ms, rest = replies[0], replies[1], replies[2], replies[3:]
        queued, due, backlog = {}, {}, {}
        for i, queue in enumerate(queues):
            size, due_now, log_len, cursor = rest[4 * i:4 * i + 4]
            queued[queue], due[queue] = int(size), int(due_now)
            backlog[queue] = _unsynced(shard.client, redo_key(n, queue), cursor, int(log_len))
        views.append(ShardView(n, int(term or 0), bool(maintaining),
                              None if next_ms is None else int(next_ms), queued, due, backlog,
                              per_shard.get(n, 0)))
    return views


def _letters_per_shard(sessions: sessionmaker[Session], numbers: Sequence[int]
                      ) -> dict[int, int]:
    """Restock dead letters per shard, counted by the database: no payload is loaded.

    The shard is only in the JSON payload, under its wire name ``node``, written with sorted
    keys, so `"node": N, "queue"` appears exactly once in a letter of shard N (a quote inside
    a JSON string is escaped, so an entry's text cannot imitate it).
    """
    d = DEAD_LETTERS.c
    counts = [func.sum(case((d.payload.like(f'%"node": {n}, "queue"%'), 1), else_=0))
              for n in numbers]
    if not counts:
        return {}
    with sessions() as session:
        row = session.execute(select(*counts).where(d.kind == DEAD_LETTER_KIND)).one()
    return {n: int(c or 0) for n, c in zip(numbers, row, strict=True)}


def _unsynced(client: Any, stream: str, cursor: bytes | None, length: int) -> int:
    """Redo-log entries after the sync cursor (the log keeps synced entries until trimmed)."""
    if cursor is None:
        return length
    after = client.xrange(stream, min=b"(" + cursor, max="+", count=10_001)
    return len(after)


def shards_json(views: Sequence[ShardView], now_ms: int) -> list[dict[str, Any]]:
    """Every shard as a JSON object (`window` is the maintenance column's text); the shard's
    number goes out under its wire name, ``node``."""
    return [{**{("node" if k == "shard" else k): x for k, x in asdict(v).items()},
             "window": v.window(now_ms) if v.error is None else None} for v in views]

