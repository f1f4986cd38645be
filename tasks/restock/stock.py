"""Redis stock of the restock feature (seed 002): keys, the three Lua scripts, their replies.

Stock is sharded over Redis nodes; node N's keys share the hash tag ``{node:N}`` (braces
literal), so every script touches one Redis Cluster slot. Within a node, stock is deducted
into per-queue redo logs, each drained through its own delay queue::

    deduct.lua   stock -= qty, record the deduction, append a redo-log entry
    sync.lua     redo log -> delay queue (sorted set scored by due time)
    due.lua      the delay queue's due entries, by the node's clock
    restock.lua  due entries of unpaid orders -> stock += qty, exactly once per entry
    discard.lua  remove dead-lettered entries from the delay queue (drainer only)
    rebuild.lua  maintenance: stock from the database, a new term, pending items re-issued

Two leases of the ``lease`` package guard a node, named with the node's hash tag so their
keys share its slot and the scripts can check them: ``{node:N}:drain:QUEUE`` (the queue's one
drainer) and ``{node:N}:maintenance`` (the rebuilder; while it exists the node is in its
maintenance window and every other script refuses).

Every reply code maps to one :class:`Action` in :data:`ACTIONS`, and the wrappers of
:class:`StockScripts` turn codes into results or exceptions; nothing else reads raw replies.

One clock: entry times and "now" come from the node itself (Redis ``TIME``, read inside
deduct.lua and due.lua), never from a worker's wall clock, so a worker whose clock is off
moves no due time and releases nothing early. Tests substitute a fake *node* clock (shared by
every process of the test) through ``StockScripts(clock=...)``; production passes none.

One generation: the database records the node's term (every rebuild) and every deduction's
offset; deduct.lua refuses (STALE) while the node's own term or offset counter is behind
them, i.e. the node came back older than the database (an older snapshot, a lagging replica,
an empty restart), until a rebuild levels it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

from lease.keys import lease_key
from tasks.restock.redolog import (
    MAX_SKU_NUM,
    MalformedEntry,
    RedoEntry,
    check_id,
    format_entry,
    parse_entry,
)

__all__ = [
    "ACTIONS",
    "BAD_QUANTITY",
    "DEDUCT",
    "ATTEMPTS_PREFIX",
    "DEDUCTED_PREFIX",
    "DISCARD",
    "DUE",
    "META_PREFIX",
    "REBUILD",
    "DEFAULT_CAPACITY",
    "DEFAULT_DELAY_MS",
    "DELAY_PREFIX",
    "DUPLICATE",
    "FULL",
    "HAS_BEEN_CONSUMED",
    "INSUFFICIENT",
    "LOCK_FAILED",
    "MAINTAINING",
    "OFFSETS_PREFIX",
    "OFFSET_PREFIX",
    "OK",
    "PAID",
    "REBUILD_ATTEMPTS_PREFIX",
    "REDO_CURSOR_PREFIX",
    "REDO_PREFIX",
    "RESTOCK",
    "STALE",
    "STOCK_PREFIX",
    "SUCCESS",
    "SYNC",
    "TERM_PREFIX",
    "UNKNOWN_SKU",
    "WRONG_TERM",
    "Action",
    "BadQuantity",
    "Deduction",
    "Generation",
    "InsufficientStock",
    "LockNotHeld",
    "NodeMaintaining",
    "NodeStale",
    "QueueFull",
    "Reissue",
    "RestockResult",
    "StockError",
    "StockScripts",
    "UnexpectedReply",
    "UnknownSku",
    "attempts_key",
    "deduct_keys",
    "deducted_key",
    "drain_lease_name",
    "maintenance_lease_name",
    "meta_key",
    "delay_key",
    "drain_lock_key",
    "maintaining_key",
    "node_tag",
    "offset_key",
    "offsets_key",
    "queue_names",
    "rebuild_attempts_key",
    "redo_cursor_key",
    "redo_key",
    "stock_key",
    "term_key",
]

# --- keys -----------------------------------------------------------------------------------
# Node keys end in "{node:N}"; queue keys add ":QUEUE" after the tag (same slot).

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
# window opens and when the last rebuild finished. No TTL. Owner: tasks.restock.maintenance; a node
# without it (new, or restarted empty) is rebuilt at once.
META_PREFIX = "meta:"

# lease:{node:N}:maintenance (lease package) exists while the node is in its maintenance
# window; deduct, sync, restock and discard refuse then. TTL: the rebuilder's lease TTL,
# renewed while it makes progress. Owner: tasks.restock.maintenance; rebuild.lua checks its token.
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

# The seed's numbers: unpaid orders are restocked after 10 minutes; a queue holding 100,000
# entries stops syncing.
DEFAULT_DELAY_MS = 10 * 60 * 1000
DEFAULT_CAPACITY = 100_000


def queue_names(count: int) -> list[str]:
    """The names of a node's `count` delay queues: q0, q1, ..."""
    return [f"q{i}" for i in range(count)]


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


def maintenance_lease_name(redis_id: int) -> str:
    """The name of the node's maintenance lease (lease package)."""
    return f"{node_tag(redis_id)}:maintenance"


def drain_lease_name(redis_id: int, queue: str) -> str:
    """The name of the queue drainer's lease (lease package)."""
    return f"{node_tag(redis_id)}:drain:{_queue(queue)}"


def maintaining_key(redis_id: int) -> str:
    """The key that exists while the node is in maintenance: its maintenance lease."""
    return lease_key(maintenance_lease_name(redis_id))


def redo_key(redis_id: int, queue: str) -> str:
    """The queue's redo-log stream."""
    return f"{REDO_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def redo_cursor_key(redis_id: int, queue: str) -> str:
    """The queue's sync cursor."""
    return f"{REDO_CURSOR_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def offset_key(redis_id: int) -> str:
    """The node's offset counter."""
    return f"{OFFSET_PREFIX}{node_tag(redis_id)}"


def offsets_key(redis_id: int, queue: str) -> str:
    """The queue's per-SKU restocked offsets."""
    return f"{OFFSETS_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def delay_key(redis_id: int, queue: str) -> str:
    """The queue's delay queue."""
    return f"{DELAY_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def drain_lock_key(redis_id: int, queue: str) -> str:
    """The key holding the queue drainer's lease token."""
    return lease_key(drain_lease_name(redis_id, queue))


def attempts_key(redis_id: int, queue: str) -> str:
    """The queue's failed-attempt counts."""
    return f"{ATTEMPTS_PREFIX}{node_tag(redis_id)}:{_queue(queue)}"


def rebuild_attempts_key(redis_id: int) -> str:
    """The node's unfinished rebuild attempts."""
    return f"{REBUILD_ATTEMPTS_PREFIX}{node_tag(redis_id)}"


def deduct_keys(redis_id: int, queue: str) -> list[str]:
    """Every key deduct.lua touches, in its KEYS order."""
    return [stock_key(redis_id), deducted_key(redis_id), redo_key(redis_id, queue),
            term_key(redis_id), offset_key(redis_id), maintaining_key(redis_id)]


# --- scripts and reply codes ----------------------------------------------------------------


def _load(name: str) -> str:
    return (resources.files("tasks.restock") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


DEDUCT = _load("deduct")
SYNC = _load("sync")
RESTOCK = _load("restock")
DISCARD = _load("discard")
DUE = _load("due")
REBUILD = _load("rebuild")

OK = "OK"
UNKNOWN_SKU = "UNKNOWN_SKU"
BAD_QUANTITY = "BAD_QUANTITY"
DUPLICATE = "DUPLICATE"
INSUFFICIENT = "INSUFFICIENT"
MAINTAINING = "MAINTAINING"
STALE = "STALE"
FULL = "FULL"
SUCCESS = "SUCCESS"
LOCK_FAILED = "LOCK_FAILED"
WRONG_TERM = "WRONG_TERM"
HAS_BEEN_CONSUMED = "HAS_BEEN_CONSUMED"
PAID = "PAID"


class Action(enum.Enum):
    """What the caller does about a reply code."""

    DONE = "done"  # the call did (or had already done) its work
    REJECTED = "rejected"  # refused for good: retrying the same call cannot succeed
    RESTOCKED = "restocked"  # the entry's stock is back; entry removed
    SKIPPED = "skipped"  # entry consumed without a stock change; entry removed
    ABORT_BATCH = "abort_batch"  # node busy or queue full: stop, try again later
    REACQUIRE = "reacquire"  # the drain lock is not ours: stop the batch, re-acquire first


# The one mapping from reply code to action.
ACTIONS: dict[str, Action] = {
    OK: Action.DONE,
    DUPLICATE: Action.DONE,
    UNKNOWN_SKU: Action.REJECTED,
    BAD_QUANTITY: Action.REJECTED,
    INSUFFICIENT: Action.REJECTED,
    MAINTAINING: Action.ABORT_BATCH,  # also: deduct refused; retry after the window
    STALE: Action.ABORT_BATCH,  # deduct refused until the node's rebuild
    FULL: Action.ABORT_BATCH,
    SUCCESS: Action.RESTOCKED,
    WRONG_TERM: Action.SKIPPED,
    HAS_BEEN_CONSUMED: Action.SKIPPED,
    PAID: Action.SKIPPED,
    LOCK_FAILED: Action.REACQUIRE,
}


class StockError(Exception):
    """Base of every refusal the stock scripts report."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


class UnknownSku(StockError):
    """The node has no such SKU."""


class BadQuantity(StockError):
    """The quantity is not an integer in 1..MAX_SKU_NUM."""


class InsufficientStock(StockError):
    """Fewer units left than asked for; nothing was deducted."""


class NodeMaintaining(StockError):
    """The node is being rebuilt; nothing was done. Try again after the window."""


class NodeStale(StockError):
    """The node is older than the database (its term or offset counter is behind what the
    database recorded): it lost writes. Nothing was done; deductions wait for its rebuild."""


class QueueFull(StockError):
    """The delay queue is at capacity; the redo log keeps the entries (backpressure)."""


class LockNotHeld(StockError):
    """The queue's drain lock does not hold this token (lost or never held); nothing done."""


class UnexpectedReply(StockError):
    """A reply no script is documented to give."""


_ERRORS: dict[str, type[StockError]] = {
    UNKNOWN_SKU: UnknownSku,
    BAD_QUANTITY: BadQuantity,
    INSUFFICIENT: InsufficientStock,
    MAINTAINING: NodeMaintaining,
    STALE: NodeStale,
    FULL: QueueFull,
    LOCK_FAILED: LockNotHeld,
}


@dataclass(frozen=True)
class Generation:
    """How far the database has seen node's state go: the last term a rebuild handed out and
    the highest offset an order item recorded. A node behind either lost writes."""

    term: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Deduction:
    """A deduction on record: `duplicate` when an earlier call had already made it."""

    entry: RedoEntry
    duplicate: bool


@dataclass(frozen=True)
class RestockResult:
    """What restock.lua did with one entry."""

    entry: RedoEntry
    status: str
    action: Action


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _raise_for(code: str, detail: str) -> None:
    """Raise the exception of a refusal code; return for DONE/RESTOCKED/SKIPPED codes."""
    action = ACTIONS.get(code)
    if action is None:
        raise UnexpectedReply(code, detail)
    if action in (Action.REJECTED, Action.ABORT_BATCH, Action.REACQUIRE):
        raise _ERRORS[code](code, detail)


class StockScripts:
    """The node's scripts registered on one client, behind typed wrappers.

    Each public method checks its arguments, and its ``_do_*`` twin runs the script. Times
    come from the node: `clock` is None in production (the scripts read Redis ``TIME``); a
    test passes a fake clock that stands for the node's and is shared by all its processes.
    """

    def __init__(self, client: Any, clock: Callable[[], int] | None = None) -> None:
        self.client = client
        self.clock = clock
        self.due_script = client.register_script(DUE)
        self.deduct_script = client.register_script(DEDUCT)
        self.sync_script = client.register_script(SYNC)
        self.restock_script = client.register_script(RESTOCK)
        self.discard_script = client.register_script(DISCARD)
        self.rebuild_script = client.register_script(REBUILD)

    def _now_arg(self) -> str:
        """The scripts' `now` argument: '' (Redis TIME) unless a test injected a node clock."""
        return "" if self.clock is None else str(int(self.clock()))

    def now_ms(self) -> int:
        """The node's clock in milliseconds: the one every due time and window is read on."""
        if self.clock is not None:
            return int(self.clock())
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def run(self, script: Script, keys: Sequence[str], args: Sequence[str | int | bytes]
            ) -> Any:
        """EVALSHA `script`; on NoScriptError load it once and EVALSHA again."""
        try:
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self.client.evalsha(script.sha, len(keys), *keys, *args)

    # deduct ------------------------------------------------------------------------------

    def deduct(
        self, redis_id: int, queue: str, order_item_id: str, sku_id: str, qty: int,
        member_id: str, generation: Generation | None = None,
    ) -> Deduction:
        """Take `qty` of `sku_id` for `order_item_id` once; return the deduction on record.

        `generation` is the node's state as the database knows it (default: nothing known).
        Raises UnknownSku, BadQuantity, InsufficientStock, NodeMaintaining or NodeStale
        (nothing changed). A repeated call for the same order item returns the original entry
        with ``duplicate=True``. The entry's time is the node's clock.
        """
        for field, value in (("order_item_id", order_item_id), ("sku_id", sku_id),
                             ("member_id", member_id)):
            check_id(field, value)
        return self._do_deduct(redis_id, queue, order_item_id, sku_id, qty, member_id,
                               generation or Generation())

    def _do_deduct(
        self, redis_id: int, queue: str, order_item_id: str, sku_id: str, qty: int,
        member_id: str, generation: Generation,
    ) -> Deduction:
        keys = deduct_keys(redis_id, queue)
        args: list[str | int] = [order_item_id, sku_id, str(qty), self._now_arg(), member_id,
                                 queue, redis_id, MAX_SKU_NUM, generation.term,
                                 generation.offset]
        code, detail = (_text(part) for part in self.run(self.deduct_script, keys, args))
        _raise_for(code, detail)
        return Deduction(entry=parse_entry(detail), duplicate=code == DUPLICATE)

    # sync --------------------------------------------------------------------------------

    def sync(
        self, redis_id: int, queue: str, count: int = 100, capacity: int = DEFAULT_CAPACITY,
        delay_ms: int = DEFAULT_DELAY_MS,
    ) -> int:
        """Move up to `count` redo-log entries into the delay queue; return how many moved.

        Raises NodeMaintaining or QueueFull; the entries then stay in the log for a later call.
        """
        if count <= 0 or capacity <= 0 or delay_ms < 0:
            raise ValueError("count and capacity must be positive, delay_ms non-negative")
        keys = [redo_key(redis_id, queue), redo_cursor_key(redis_id, queue),
                delay_key(redis_id, queue), maintaining_key(redis_id)]
        code, detail = (_text(part) for part in
                        self.run(self.sync_script, keys, [count, capacity, delay_ms]))
        _raise_for(code, detail)
        return int(detail)

    # restock -----------------------------------------------------------------------------

    def due(self, redis_id: int, queue: str, limit: int = 100) -> list[bytes]:
        """The delay queue's members due now by the node's clock, earliest first, as the raw
        bytes stored (a member need not even be UTF-8)."""
        if limit <= 0:
            raise ValueError("limit must be positive")
        members = self.run(self.due_script, [delay_key(redis_id, queue)],
                           [self._now_arg(), limit])
        return [m if isinstance(m, bytes) else str(m).encode() for m in members]

    def restock(
        self, redis_id: int, queue: str, token: str, batch: Sequence[tuple[RedoEntry, bool]],
    ) -> list[RestockResult]:
        """Apply `batch` of (entry, paid) in offset order; return one result per entry.

        `paid` comes from the database. Raises NodeMaintaining or LockNotHeld when the whole
        batch was refused (nothing changed).
        """
        for entry, _paid in batch:
            if entry.redis_id != redis_id or entry.queue != queue:
                raise MalformedEntry(f"entry of node {entry.redis_id} queue {entry.queue!r} "
                                     f"in a batch of node {redis_id} queue {queue!r}")
        if not batch:
            return []
        return self._do_restock(redis_id, queue, token,
                                sorted(batch, key=lambda item: item[0].offset))

    def _do_restock(
        self, redis_id: int, queue: str, token: str, batch: Sequence[tuple[RedoEntry, bool]],
    ) -> list[RestockResult]:
        keys = [maintaining_key(redis_id), drain_lock_key(redis_id, queue), term_key(redis_id),
                offsets_key(redis_id, queue), stock_key(redis_id), deducted_key(redis_id),
                delay_key(redis_id, queue), attempts_key(redis_id, queue)]
        args: list[str | int] = [token]
        for entry, paid in batch:
            args += [format_entry(entry), entry.order_item_id, entry.sku_id, entry.sku_num,
                     entry.offset, entry.term, "1" if paid else "0"]
        statuses = [_text(s) for s in self.run(self.restock_script, keys, args)]
        if len(statuses) != len(batch):
            raise UnexpectedReply("BAD_REPLY", f"{len(statuses)} statuses for {len(batch)}")
        _raise_for(statuses[0], f"batch of {len(batch)} on node {redis_id} queue {queue!r}")
        results = []
        for (entry, _paid), status in zip(batch, statuses, strict=True):
            _raise_for(status, format_entry(entry))
            results.append(RestockResult(entry=entry, status=status, action=ACTIONS[status]))
        return results

    # discard -----------------------------------------------------------------------------

    def discard(self, redis_id: int, queue: str, token: str,
                members: Sequence[str | bytes]) -> int:
        """Remove dead-lettered `members` (exactly as stored) from the delay queue, with their
        attempt counts and records; return how many were there.

        Raises LockNotHeld (nothing removed) unless `token` holds the queue's drain lease.
        """
        if not members:
            return 0
        keys = [drain_lock_key(redis_id, queue), delay_key(redis_id, queue),
                attempts_key(redis_id, queue), deducted_key(redis_id)]
        code, detail = (_text(part) for part in
                        self.run(self.discard_script, keys, [token, *members]))
        _raise_for(code, f"discard on node {redis_id} queue {queue!r}")
        return int(detail)

    # rebuild -----------------------------------------------------------------------------

    def rebuild(
        self, redis_id: int, queues: Sequence[str], token: str, generation: Generation,
        stock: Iterable[tuple[str, int]], reissue: Iterable[Reissue],
    ) -> list[RedoEntry]:
        """Set the node's term to `generation.term` and its offset counter to at least
        `generation.offset`, write `stock`, re-issue `reissue` in the new term.

        One chunk of a rebuild; raises LockNotHeld (nothing changed) unless `token` holds the
        node's maintenance lease. Returns the re-issued entries.
        """
        index = {queue: q for q, queue in enumerate(queues)}
        keys = [maintaining_key(redis_id), stock_key(redis_id), term_key(redis_id),
                deducted_key(redis_id), offset_key(redis_id)]
        for queue in queues:
            keys += [redo_key(redis_id, queue), offsets_key(redis_id, queue)]
        pairs = [(check_id("sku_id", sku), int(qty)) for sku, qty in stock]
        args: list[str | int] = [token, generation.term, redis_id, generation.offset,
                                 len(pairs)]
        for sku, qty in pairs:
            args += [sku, qty]
        for item in reissue:
            args += [index[item.queue], item.queue, item.order_item_id, item.sku_id,
                     item.qty, item.time_ms, item.member_id]
        reply = [_text(part) for part in self.run(self.rebuild_script, keys, args)]
        _raise_for(reply[0], f"rebuild of node {redis_id}")
        return [parse_entry(entry) for entry in reply[1:]]


@dataclass(frozen=True)
class Reissue:
    """An order item that still holds stock unpaid when its node is rebuilt."""

    queue: str
    order_item_id: str
    sku_id: str
    qty: int
    time_ms: int
    member_id: str
