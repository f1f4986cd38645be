"""Every Redis key of the restock wing: prefixes, lifetimes and owners, in one place.

Stock is split into RESTOCK_SHARDS logical shards; shard N's keys share the hash tag
``{stock:N}`` (braces literal), so every stock script touches one Redis Cluster slot and a
shard lives wherever its slot lives (one Redis, a Cluster's master, master N % masters). Shard
keys end in the tag; queue keys add ``:QUEUE`` after it (same slot). The functions' `shard`
argument is the shard's number (the database's ``redis_id`` columns and the redo entry's
``redisId`` field hold the same number under their older, wire name). This is the one
module of the wing that spells a key prefix: everything else builds keys with the functions
below.

Two leases of the ``lease`` package guard a shard, named with the shard's hash tag so their
keys share its slot and the scripts can check them: ``{stock:N}:drain:QUEUE`` (the queue's one
drainer) and ``{stock:N}:maintenance`` (the rebuilder; while it exists the shard is in its
maintenance window and every other script refuses).
"""

from __future__ import annotations

from collections.abc import Sequence

from lease.keys import lease_key
from tasks.restock.redolog import check_id

__all__ = [
    "ATTEMPTS_PREFIX",
    "DEDUCTED_PREFIX",
    "DELAY_PREFIX",
    "META_PREFIX",
    "OFFSETS_PREFIX",
    "OFFSET_PREFIX",
    "REBUILD_ATTEMPTS_PREFIX",
    "REDO_CURSOR_PREFIX",
    "REDO_PREFIX",
    "STOCK_PREFIX",
    "TERM_PREFIX",
    "attempts_key",
    "deduct_keys",
    "deducted_key",
    "delay_key",
    "discard_keys",
    "drain_lease_name",
    "drain_lock_key",
    "maintaining_key",
    "maintenance_lease_name",
    "meta_key",
    "shard_tag",
    "offset_key",
    "offsets_key",
    "rebuild_attempts_key",
    "rebuild_keys",
    "redo_cursor_key",
    "redo_key",
    "restock_keys",
    "stock_key",
    "sync_keys",
    "take_keys",
    "term_key",
]

# stock:{stock:N} -> hash sku_id -> available quantity. No TTL. Owner: deduct.lua (minus) and
# restock.lua (plus); rebuilt from the database by the shard's maintenance.
STOCK_PREFIX = "stock:"

# deducted:{stock:N} -> hash order_item_id -> redo-entry text, the deduction on record: it makes
# a retried deduction a no-op while the item holds stock. No TTL; trimmed: restock.lua deletes
# a record with the entry it records (the item's stock is settled, back or sold) and
# discard.lua with a dead-lettered entry, so it holds one field per pending item. Owner:
# deduct.lua; rebuild.lua replaces the record of each re-issued item; read by restock.lua (PAID
# rule) and the rebuild ('reserving' items).
DEDUCTED_PREFIX = "deducted:"

# term:{stock:N} -> integer, the shard's term. No TTL. Owner: the maintenance rebuild, which
# bumps it; read by deduct.lua (stamped in entries), take.lua (with a drain batch: the drainer
# releases only the items of that term's entries) and restock.lua (WRONG_TERM).
TERM_PREFIX = "term:"

# meta:{stock:N} -> hash {next_maintain_ms, rebuilt_ms}: when the shard's next maintenance
# window opens and when the last rebuild finished. No TTL. Owner: tasks.restock.maintenance; a
# shard without it (new, or restarted empty) is rebuilt at once.
META_PREFIX = "meta:"

# lease:{stock:N}:maintenance (lease package) exists while the shard is in its maintenance
# window; deduct, sync, restock and discard refuse then. TTL: the rebuilder's lease TTL,
# renewed while it makes progress. Owner: tasks.restock.maintenance; rebuild.lua checks its
# token.
# lease:{stock:N}:drain:QUEUE (lease package): the queue drainer's token. TTL: the drainer's
# lease TTL. Owner: tasks.restock.drain; restock.lua and discard.lua check it.

# redo:{stock:N}:QUEUE -> stream of {e = entry text, t = time_ms}. No TTL. Owner: deduct.lua and
# rebuild.lua append; sync.lua reads it and trims what it moved to the delay queue.
REDO_PREFIX = "redo:"

# redo-cursor:{stock:N}:QUEUE -> hash {id, score}: last stream id synced and its delay score.
# No TTL. Owner: sync.lua.
REDO_CURSOR_PREFIX = "redo-cursor:"

# offset:{stock:N} -> integer, the shard's last handed-out offset (one counter for all its
# queues, so the database's highest recorded offset tells whether the shard lost deductions).
# No TTL (a reset counter would make restock.lua skip new entries as consumed; deduct.lua
# refuses STALE when it is behind the database). Owner: deduct.lua and rebuild.lua.
OFFSET_PREFIX = "offset:"

# offsets:{stock:N}:QUEUE -> hash sku_id -> offset of the last entry restocked (or found paid).
# No TTL; one field per SKU, deleted by every rebuild (offsets count within a term). Owner:
# restock.lua (idempotency: HAS_BEEN_CONSUMED).
OFFSETS_PREFIX = "offsets:"

# delay:{stock:N}:QUEUE -> sorted set entry text -> due time in ms. No TTL. Owner: sync.lua adds,
# restock.lua removes.
DELAY_PREFIX = "delay:"

# drain-attempts:{stock:N}:QUEUE -> hash member -> drain attempts at it, counted before each
# attempt (so a drainer that dies mid-batch counts). No TTL; restock.lua and discard.lua delete
# a member's count with the member, so it holds at most one field per queued entry. Owner:
# tasks.restock.drain (take.lua counts each batch; the drainer gives back what it did not get to).
ATTEMPTS_PREFIX = "drain-attempts:"

# rebuild-attempts:{stock:N} -> integer, rebuilds of the shard started and not finished (a
# rebuild that dies leaves its count). TTL: the maintenance interval, so a shard whose rebuild
# was dead-lettered is tried again once per window. Owner: tasks.restock.maintenance.
REBUILD_ATTEMPTS_PREFIX = "rebuild-attempts:"


def shard_tag(shard: int) -> str:
    """The hash tag shared by every key of shard `shard`, braces included."""
    if not isinstance(shard, int) or isinstance(shard, bool) or shard < 0:
        raise ValueError(f"shard must be a non-negative integer, got {shard!r}")
    return f"{{stock:{shard}}}"


def _queue(queue: str) -> str:
    check_id("queue", queue)
    if "{" in queue or "}" in queue:
        raise ValueError(f"queue must not contain braces: {queue!r}")
    return queue


# --- shard keys -----------------------------------------------------------------------------


def stock_key(shard: int) -> str:
    """The shard's stock hash."""
    return f"{STOCK_PREFIX}{shard_tag(shard)}"


def deducted_key(shard: int) -> str:
    """The shard's deductions on record."""
    return f"{DEDUCTED_PREFIX}{shard_tag(shard)}"


def term_key(shard: int) -> str:
    """The shard's term."""
    return f"{TERM_PREFIX}{shard_tag(shard)}"


def meta_key(shard: int) -> str:
    """The shard's maintenance schedule."""
    return f"{META_PREFIX}{shard_tag(shard)}"


def offset_key(shard: int) -> str:
    """The shard's offset counter."""
    return f"{OFFSET_PREFIX}{shard_tag(shard)}"


def rebuild_attempts_key(shard: int) -> str:
    """The shard's unfinished rebuild attempts."""
    return f"{REBUILD_ATTEMPTS_PREFIX}{shard_tag(shard)}"


def maintenance_lease_name(shard: int) -> str:
    """The name of the shard's maintenance lease (lease package)."""
    return f"{shard_tag(shard)}:maintenance"


def maintaining_key(shard: int) -> str:
    """The key that exists while the shard is in maintenance: its maintenance lease."""
    return lease_key(maintenance_lease_name(shard))


# --- queue keys -----------------------------------------------------------------------------


def redo_key(shard: int, queue: str) -> str:
    """The queue's redo-log stream."""
    return f"{REDO_PREFIX}{shard_tag(shard)}:{_queue(queue)}"


def redo_cursor_key(shard: int, queue: str) -> str:
    """The queue's sync cursor."""
    return f"{REDO_CURSOR_PREFIX}{shard_tag(shard)}:{_queue(queue)}"


def offsets_key(shard: int, queue: str) -> str:
    """The queue's per-SKU restocked offsets."""
    return f"{OFFSETS_PREFIX}{shard_tag(shard)}:{_queue(queue)}"


def delay_key(shard: int, queue: str) -> str:
    """The queue's delay queue."""
    return f"{DELAY_PREFIX}{shard_tag(shard)}:{_queue(queue)}"


def attempts_key(shard: int, queue: str) -> str:
    """The queue's failed-attempt counts."""
    return f"{ATTEMPTS_PREFIX}{shard_tag(shard)}:{_queue(queue)}"


def drain_lease_name(shard: int, queue: str) -> str:
    """The name of the queue drainer's lease (lease package)."""
    return f"{shard_tag(shard)}:drain:{_queue(queue)}"


def drain_lock_key(shard: int, queue: str) -> str:
    """The key holding the queue drainer's lease token."""
    return lease_key(drain_lease_name(shard, queue))


# --- each script's KEYS, in its order (the header of its lua/*.lua names them) -------------


def deduct_keys(shard: int, queue: str) -> list[str]:
    """Every key deduct.lua touches, in its KEYS order."""
    return [stock_key(shard), deducted_key(shard), redo_key(shard, queue),
            term_key(shard), offset_key(shard), maintaining_key(shard)]


def take_keys(shard: int, queue: str) -> list[str]:
    """Every key take.lua touches, in its KEYS order."""
    return [delay_key(shard, queue), attempts_key(shard, queue), term_key(shard)]


def sync_keys(shard: int, queue: str) -> list[str]:
    """Every key sync.lua touches, in its KEYS order."""
    return [redo_key(shard, queue), redo_cursor_key(shard, queue),
            delay_key(shard, queue), maintaining_key(shard)]


def restock_keys(shard: int, queue: str) -> list[str]:
    """Every key restock.lua touches, in its KEYS order."""
    return [maintaining_key(shard), drain_lock_key(shard, queue), term_key(shard),
            offsets_key(shard, queue), stock_key(shard), deducted_key(shard),
            delay_key(shard, queue), attempts_key(shard, queue)]


def discard_keys(shard: int, queue: str) -> list[str]:
    """Every key discard.lua touches, in its KEYS order."""
    return [drain_lock_key(shard, queue), delay_key(shard, queue),
            attempts_key(shard, queue), deducted_key(shard)]


def rebuild_keys(shard: int, queues: Sequence[str]) -> list[str]:
    """Every key rebuild.lua touches, in its KEYS order: the shard's, then two per queue."""
    keys = [maintaining_key(shard), stock_key(shard), term_key(shard),
            deducted_key(shard), offset_key(shard)]
    for queue in queues:
        keys += [redo_key(shard, queue), offsets_key(shard, queue)]
    return keys
