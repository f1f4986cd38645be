"""Every Redis key of the restock wing: prefixes, lifetimes and owners, in one place.

Stock is sharded over Redis nodes; node N's keys share the hash tag ``{node:N}`` (braces
literal), so every stock script touches one Redis Cluster slot. Node keys end in the tag;
queue keys add ``:QUEUE`` after it (same slot). This is the one module of the wing that spells
a key prefix: everything else builds keys with the functions below.

Two leases of the ``lease`` package guard a node, named with the node's hash tag so their
keys share its slot and the scripts can check them: ``{node:N}:drain:QUEUE`` (the queue's one
drainer) and ``{node:N}:maintenance`` (the rebuilder; while it exists the node is in its
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
    "due_keys",
    "maintaining_key",
    "maintenance_lease_name",
    "meta_key",
    "node_tag",
    "offset_key",
    "offsets_key",
    "rebuild_attempts_key",
    "rebuild_keys",
    "redo_cursor_key",
    "redo_key",
    "restock_keys",
    "stock_key",
    "sync_keys",
    "term_key",
]

# stock:{node:N} -> hash sku_id -> available quantity. No TTL. Owner: deduct.lua (minus) and
# restock.lua (plus); rebuilt from the database by the node's maintenance.
STOCK_PREFIX = "stock:"

# deducted:{node:N} -> hash order_item_id -> redo-entry text, the deduction on record: it makes
# a retried deduction a no-op while the item holds stock. No TTL; trimmed: restock.lua deletes
# a record with the entry it records (the item's stock is settled, back or sold) and
# discard.lua with a dead-lettered entry, so it holds one field per pending item. Owner:
# deduct.lua; rebuild.lua replaces the record of each re-issued item; read by restock.lua (PAID
# rule) and the rebuild ('reserving' items).
DEDUCTED_PREFIX = "deducted:"

# term:{node:N} -> integer, the node's term. No TTL. Owner: the maintenance rebuild, which
# bumps it; read by deduct.lua (stamped in entries) and restock.lua (WRONG_TERM).
TERM_PREFIX = "term:"

# meta:{node:N} -> hash {next_maintain_ms, rebuilt_ms}: when the node's next maintenance
# window opens and when the last rebuild finished. No TTL. Owner: tasks.restock.maintenance; a
# node without it (new, or restarted empty) is rebuilt at once.
META_PREFIX = "meta:"

# lease:{node:N}:maintenance (lease package) exists while the node is in its maintenance
# window; deduct, sync, restock and discard refuse then. TTL: the rebuilder's lease TTL,
# renewed while it makes progress. Owner: tasks.restock.maintenance; rebuild.lua checks its
# token.
# lease:{node:N}:drain:QUEUE (lease package): the queue drainer's token. TTL: the drainer's
# lease TTL. Owner: tasks.restock.drain; restock.lua and discard.lua check it.

# redo:{node:N}:QUEUE -> stream of {e = entry text, t = time_ms}. No TTL. Owner: deduct.lua and
# rebuild.lua append; sync.lua reads it and trims what it moved to the delay queue.
REDO_PREFIX = "redo:"

# redo-cursor:{node:N}:QUEUE -> hash {id, score}: last stream id synced and its delay score.
# No TTL. Owner: sync.lua.
REDO_CURSOR_PREFIX = "redo-cursor:"

# offset:{node:N} -> integer, the node's last handed-out offset (one counter for all its
# queues, so the database's highest recorded offset tells whether the node lost deductions).
# No TTL (a reset counter would make restock.lua skip new entries as consumed; deduct.lua
# refuses STALE when it is behind the database). Owner: deduct.lua and rebuild.lua.
OFFSET_PREFIX = "offset:"

# offsets:{node:N}:QUEUE -> hash sku_id -> offset of the last entry restocked (or found paid).
# No TTL; one field per SKU, deleted by every rebuild (offsets count within a term). Owner:
# restock.lua (idempotency: HAS_BEEN_CONSUMED).
OFFSETS_PREFIX = "offsets:"

# delay:{node:N}:QUEUE -> sorted set entry text -> due time in ms. No TTL. Owner: sync.lua adds,
# restock.lua removes.
DELAY_PREFIX = "delay:"

# drain-attempts:{node:N}:QUEUE -> hash member -> drain attempts at it, counted before each
# attempt (so a drainer that dies mid-batch counts). No TTL; restock.lua and discard.lua delete
# a member's count with the member, so it holds at most one field per queued entry. Owner:
# tasks.restock.drain.
ATTEMPTS_PREFIX = "drain-attempts:"

# rebuild-attempts:{node:N} -> integer, rebuilds of the node started and not finished (a
# rebuild that dies leaves its count). TTL: the maintenance interval, so a node whose rebuild
# was dead-lettered is tried again once per window. Owner: tasks.restock.maintenance.
REBUILD_ATTEMPTS_PREFIX = "rebuild-attempts:"


def node_tag(redis_id: int) -> str:
    """The hash tag shared by every key of node `redis_id`, braces included."""
    if not isinstance(redis_id, int) or isinstance(redis_id, bool) or redis_id < 0:
        raise ValueError(f"redis_id must be a non-negative integer, got {redis_id!r}")
    return f"{{node:{redis_id}}}"


def _queue(queue: str) -> str:
    check_id("queue", queue)
    if "{" in queue or "}" in queue:
        raise ValueError(f"queue must not contain braces: {queue!r}")
    return queue


# --- node keys ------------------------------------------------------------------------------


def stock_key(redis_id: int) -> str:
    """The node's stock hash."""
    return f"{STOCK_PREFIX}{node_tag(redis_id)}"


def deducted_key(redis_id: int) -> str:
    """The node's deductions on record."""
    return f"{DEDUCTED_PREFIX}{node_tag(redis_id)}"


def term_key(redis_id: int) -> str:
    """The node's term."""
    return f"{TERM_PREFIX}{node_tag(redis_id)}"


def meta_key(redis_id: int) -> str:
    """The node's maintenance schedule."""
    return f"{META_PREFIX}{node_tag(redis_id)}"


def offset_key(redis_id: int) -> str:
    """The node's offset counter."""
    return f"{OFFSET_PREFIX}{node_tag(redis_id)}"


def rebuild_attempts_key(redis_id: int) -> str:
    """The node's unfinished rebuild attempts."""
    return f"{REBUILD_ATTEMPTS_PREFIX}{node_tag(redis_id)}"


def maintenance_lease_name(redis_id: int) -> str:
    """The name of the node's maintenance lease (lease package)."""
    return f"{node_tag(redis_id)}:maintenance"


def maintaining_key(redis_id: int) -> str:
    """The key that exists while the node is in maintenance: its maintenance lease."""
    return lease_key(maintenance_lease_name(redis_id))


# --- queue keys -----------------------------------------------------------------------------


def redo_key(redis_id: int, queue: str) -> str:
    """The queue's redo-log stream."""
    return f"{REDO_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def redo_cursor_key(redis_id: int, queue: str) -> str:
    """The queue's sync cursor."""
    return f"{REDO_CURSOR_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def offsets_key(redis_id: int, queue: str) -> str:
    """The queue's per-SKU restocked offsets."""
    return f"{OFFSETS_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def delay_key(redis_id: int, queue: str) -> str:
    """The queue's delay queue."""
    return f"{DELAY_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def attempts_key(redis_id: int, queue: str) -> str:
    """The queue's failed-attempt counts."""
    return f"{ATTEMPTS_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def drain_lease_name(redis_id: int, queue: str) -> str:
    """The name of the queue drainer's lease (lease package)."""
    return f"{node_tag(redis_id)}:drain:{_queue(queue)}"


def drain_lock_key(redis_id: int, queue: str) -> str:
    """The key holding the queue drainer's lease token."""
    return lease_key(drain_lease_name(redis_id, queue))


# --- each script's KEYS, in its order (the header of its lua/*.lua names them) -------------


def deduct_keys(redis_id: int, queue: str) -> list[str]:
    """Every key deduct.lua touches, in its KEYS order."""
    return [stock_key(redis_id), deducted_key(redis_id), redo_key(redis_id, queue),
            term_key(redis_id), offset_key(redis_id), maintaining_key(redis_id)]


def due_keys(redis_id: int, queue: str) -> list[str]:
    """Every key due.lua touches, in its KEYS order."""
    return [delay_key(redis_id, queue)]


def sync_keys(redis_id: int, queue: str) -> list[str]:
    """Every key sync.lua touches, in its KEYS order."""
    return [redo_key(redis_id, queue), redo_cursor_key(redis_id, queue),
            delay_key(redis_id, queue), maintaining_key(redis_id)]


def restock_keys(redis_id: int, queue: str) -> list[str]:
    """Every key restock.lua touches, in its KEYS order."""
    return [maintaining_key(redis_id), drain_lock_key(redis_id, queue), term_key(redis_id),
            offsets_key(redis_id, queue), stock_key(redis_id), deducted_key(redis_id),
            delay_key(redis_id, queue), attempts_key(redis_id, queue)]


def discard_keys(redis_id: int, queue: str) -> list[str]:
    """Every key discard.lua touches, in its KEYS order."""
    return [drain_lock_key(redis_id, queue), delay_key(redis_id, queue),
            attempts_key(redis_id, queue), deducted_key(redis_id)]


def rebuild_keys(redis_id: int, queues: Sequence[str]) -> list[str]:
    """Every key rebuild.lua touches, in its KEYS order: the node's, then two per queue."""
    keys = [maintaining_key(redis_id), stock_key(redis_id), term_key(redis_id),
            deducted_key(redis_id), offset_key(redis_id)]
    for queue in queues:
        keys += [redo_key(redis_id, queue), offsets_key(redis_id, queue)]
    return keys
