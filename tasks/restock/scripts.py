"""The stock scripts of a restock shard: registered once per client, run behind
typed wrappers that check their arguments and turn reply codes into results or exceptions.

Within a shard, stock is deducted into per-queue redo logs, each drained through its own delay
queue. One script per step, each a file of ``lua/`` whose header names its KEYS, ARGV and
reply::

    deduct.lua   stock -= qty, record the deduction, append a redo-log entry
    sync.lua     redo log -> delay queue (sorted set scored by due time)
    take.lua     a drain batch of due entries, an attempt counted at each first (write-ahead)
    restock.lua  due entries of unpaid orders -> stock += qty, exactly once per entry
    discard.lua  remove dead-lettered entries from the delay queue (drainer only)
    rebuild.lua  maintenance: stock from the database, a new term, pending items re-issued

Keys come from :mod:`tasks.restock.keys` (one builder per script's KEYS), reply codes and
their exceptions from :mod:`tasks.restock.replies`; loading and NOSCRIPT handling are the
platform's (`lease.scripts.load_lua`, `lease.scripts.run_script`).

One clock: entry times and "now" come from the shard itself (Redis ``TIME``, read inside
deduct.lua, sync.lua and take.lua), never from a worker's wall clock, so a worker
whose clock is off moves no due time and releases nothing early; sync.lua clamps a stream
time ahead of that clock to it. Tests substitute a fake *shard* clock (shared by
every process of the test) through ``StockScripts(clock=...)``; production passes none.

One generation: the database records the shard's term (every rebuild) and every deduction's
offset; deduct.lua refuses (STALE) while the shard's own term or offset counter is behind
them, i.e. the shard came back older than the database (an older snapshot, a lagging replica,
an empty restart), until a rebuild levels it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.commands.core import Script

from lease.scripts import load_lua, run_script
from tasks.restock.keys import (
    deduct_keys,
    discard_keys,
    rebuild_keys,
    restock_keys,
    sync_keys,
    take_keys,
)
from tasks.restock.redolog import (
    MAX_SKU_NUM,
    MalformedEntry,
    RedoEntry,
    check_id,
    format_entry,
    parse_entry,
)
from tasks.restock.replies import ACTIONS, DUPLICATE, Action, UnexpectedReply, raise_for, reply_text
from tasks.restock.settings import RestockSettings

__all__ = [
    "DEDUCT",
    "DEFAULT_CAPACITY",
    "DEFAULT_DELAY_MS",
    "DISCARD",
    "REBUILD",
    "RESTOCK",
    "SYNC",
    "TAKE",
    "Deduction",
    "Generation",
    "Reissue",
    "RestockResult",
    "StockScripts",
    "Taken",
]

DEDUCT = load_lua("tasks.restock", "deduct")
SYNC = load_lua("tasks.restock", "sync")
TAKE = load_lua("tasks.restock", "take")
RESTOCK = load_lua("tasks.restock", "restock")
DISCARD = load_lua("tasks.restock", "discard")
REBUILD = load_lua("tasks.restock", "rebuild")

# The settings' defaults (the seed's numbers: unpaid orders are restocked after 10 minutes; a
# queue holding 100,000 entries stops syncing), in the units the scripts take.
DEFAULT_DELAY_MS = round(RestockSettings.delay * 1000)
DEFAULT_CAPACITY = RestockSettings.capacity


@dataclass(frozen=True)
class Generation:
    """How far the database has seen shard's state go: the last term a rebuild handed out and
    the highest offset an order item recorded. A shard behind either lost writes."""

    term: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Reissue:
    """An order item that still holds stock unpaid when its shard is rebuilt."""

    queue: str
    order_item_id: str
    sku_id: str
    qty: int
    time_ms: int
    member_id: str


@dataclass(frozen=True)
class Deduction:
    """A deduction on record: `duplicate` when an earlier call had already made it."""

    entry: RedoEntry
    duplicate: bool


@dataclass(frozen=True)
class RestockResult:
    """What restock.lua did with one entry; `detail` says why for a FAILED one."""

    entry: RedoEntry
    status: str
    action: Action
    detail: str = ""


@dataclass(frozen=True)
class Taken:
    """A drain batch (take.lua): the members, each with its attempt count, and the shard's
    term when they were taken; only an entry of that term can restock."""

    term: int
    members: list[tuple[bytes, int]]


class StockScripts:
    """The shard's scripts registered on one client, behind typed wrappers.

    Each public method checks its arguments, and its ``_do_*`` twin runs the script. Times
    come from the shard: `clock` is None in production (the scripts read Redis ``TIME``); a
    test passes a fake clock that stands for the shard's and is shared by all its processes.
    """

    def __init__(self, client: Any, clock: Callable[[], int] | None = None) -> None:
        self.client = client
        self.clock = clock
        self.take_script = client.register_script(TAKE)
        self.deduct_script = client.register_script(DEDUCT)
        self.sync_script = client.register_script(SYNC)
        self.restock_script = client.register_script(RESTOCK)
        self.discard_script = client.register_script(DISCARD)
        self.rebuild_script = client.register_script(REBUILD)

    def _now_arg(self) -> str:
        """The scripts' `now` argument: '' (Redis TIME) unless a test injected a shard clock."""
        return "" if self.clock is None else str(int(self.clock()))

    def now_ms(self) -> int:
        """The shard's clock in milliseconds: the one every due time and window is read on."""
        if self.clock is not None:
            return int(self.clock())
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def run(self, script: Script, keys: Sequence[str], args: Sequence[str | int | bytes]
            ) -> Any:
        """EVALSHA `script` with `keys` (every key it touches) and `args`; return its reply
        (`lease.scripts.run_script`: SCRIPT LOAD once if the server lost it)."""
        return run_script(self.client, script, keys, args)

    # deduct ------------------------------------------------------------------------------

    def deduct(
        self, shard: int, queue: str, order_item_id: str, sku_id: str, qty: int,
        member_id: str, generation: Generation | None = None,
    ) -> Deduction:
        """Take `qty` of `sku_id` for `order_item_id` once; return the deduction on record.

        `generation` is the shard's state as the database knows it (default: nothing known).
        Raises UnknownSku, BadQuantity, InsufficientStock, NodeMaintaining or NodeStale
        (nothing changed). A repeated call for the same order item returns the original entry
        with ``duplicate=True``. The entry's time is the shard's clock.
        """
        for field, value in (("order_item_id", order_item_id), ("sku_id", sku_id),
                             ("member_id", member_id)):
            check_id(field, value)
        return self._do_deduct(shard, queue, order_item_id, sku_id, qty, member_id,
                               generation or Generation())

    def _do_deduct(
        self, shard: int, queue: str, order_item_id: str, sku_id: str, qty: int,
        member_id: str, generation: Generation,
    ) -> Deduction:
        keys = deduct_keys(shard, queue)
        args: list[str | int] = [order_item_id, sku_id, str(qty), self._now_arg(), member_id,
                                 queue, shard, MAX_SKU_NUM, generation.term,
                                 generation.offset]
        code, detail = (reply_text(part) for part in self.run(self.deduct_script, keys, args))
        raise_for(code, detail)
        return Deduction(entry=parse_entry(detail), duplicate=code == DUPLICATE)

    # sync --------------------------------------------------------------------------------

    def sync(
        self, shard: int, queue: str, count: int = 100, capacity: int = DEFAULT_CAPACITY,
        delay_ms: int = DEFAULT_DELAY_MS,
    ) -> int:
        """Move up to `count` redo-log entries into the delay queue; return how many moved.

        An entry is due `delay_ms` after its time, a time ahead of the shard's clock (or not a
        time) counting as the shard's now; a queued due time past now + delay + capacity is
        re-scored as if synced now (sync.lua). Raises NodeMaintaining or QueueFull; the
        entries then stay in the log for a later call.
        """
        if count <= 0 or capacity <= 0 or delay_ms < 0:
            raise ValueError("count and capacity must be positive, delay_ms non-negative")
        code, detail = (reply_text(part) for part in self.run(
            self.sync_script, sync_keys(shard, queue),
            [count, capacity, delay_ms, self._now_arg()]))
        raise_for(code, detail)
        return int(detail)

    # restock -----------------------------------------------------------------------------

    def take(self, shard: int, queue: str, limit: int = 100) -> Taken:
        """A drain batch of the queue's due members, each with its attempt count after the one
        counted here (write-ahead): every due member, up to `limit`, earliest first, or the
        first one an earlier batch counted and never finished, alone; and the shard's term.
        One round trip."""
        if limit <= 0:
            raise ValueError("limit must be positive")
        reply = self.run(self.take_script, take_keys(shard, queue), [self._now_arg(), limit])
        term = int(reply[0])
        if len(reply) == 1:
            return Taken(term, [])
        attempts = int(reply[1])  # one count for the whole batch (take.lua)
        return Taken(term, [(m if isinstance(m, bytes) else str(m).encode(), attempts)
                            for m in reply[2:]])

    def restock(
        self, shard: int, queue: str, token: str, batch: Sequence[tuple[RedoEntry, bool]],
    ) -> list[RestockResult]:
        """Apply `batch` of (entry, paid) in offset order; return one result per entry.

        `paid` comes from the database. An entry the script could not apply is FAILED (its
        `detail` says why) with nothing changed for it; the others are applied. Raises
        NodeMaintaining or LockNotHeld when the whole batch was refused, and ResponseError
        (WRONGTYPE) when a key it writes holds another type: nothing changed then.
        """
        for entry, _paid in batch:
            if entry.redis_id != shard or entry.queue != queue:
                raise MalformedEntry(f"entry of shard {entry.redis_id} queue {entry.queue!r} "
                                     f"in a batch of shard {shard} queue {queue!r}")
        if not batch:
            return []
        return self._do_restock(shard, queue, token,
                                sorted(batch, key=lambda item: item[0].offset))

    def _do_restock(
        self, shard: int, queue: str, token: str, batch: Sequence[tuple[RedoEntry, bool]],
    ) -> list[RestockResult]:
        keys = restock_keys(shard, queue)
        texts = [format_entry(entry) for entry, _paid in batch]  # reused by the reply check
        flags = "".join("1" if paid else "0" for _entry, paid in batch)
        args: list[str | int] = [token, flags, *texts]
        # One status per entry; 'FAILED:<reason>' carries its reason.
        statuses = [reply_text(s).partition(":")
                    for s in self.run(self.restock_script, keys, args)]
        if len(statuses) != len(batch):
            raise UnexpectedReply("BAD_REPLY", f"{len(statuses)} statuses for {len(batch)}")
        raise_for(statuses[0][0], f"batch of {len(batch)} on shard {shard} queue {queue!r}")
        results = []
        for (entry, _paid), (status, _, detail), text in zip(batch, statuses, texts,
                                                            strict=True):
            raise_for(status, text)
            results.append(RestockResult(entry, status, ACTIONS[status], detail))
        return results

    # discard -----------------------------------------------------------------------------

    def discard(self, shard: int, queue: str, token: str,
                members: Sequence[str | bytes]) -> int:
        """Remove dead-lettered `members` (exactly as stored) from the delay queue, with their
        attempt counts and records; return how many were there.

        Raises LockNotHeld (nothing removed) unless `token` holds the queue's drain lease.
        """
        if not members:
            return 0
        code, detail = (reply_text(part) for part in self.run(
            self.discard_script, discard_keys(shard, queue), [token, *members]))
        raise_for(code, f"discard on shard {shard} queue {queue!r}")
        return int(detail)

    # rebuild -----------------------------------------------------------------------------

    def rebuild(
        self, shard: int, queues: Sequence[str], token: str, generation: Generation,
        stock: Iterable[tuple[str, int]], reissue: Iterable[Reissue],
    ) -> list[RedoEntry]:
        """Set the shard's term to `generation.term` and its offset counter to at least
        `generation.offset`, write `stock`, re-issue `reissue` in the new term.

        One chunk of a rebuild; raises LockNotHeld (nothing changed) unless `token` holds the
        shard's maintenance lease. Returns the re-issued entries.
        """
        index = {queue: q for q, queue in enumerate(queues)}
        keys = rebuild_keys(shard, queues)
        pairs = [(check_id("sku_id", sku), int(qty)) for sku, qty in stock]
        args: list[str | int] = [token, generation.term, shard, generation.offset,
                                 len(pairs)]
        for sku, qty in pairs:
            args += [sku, qty]
        for item in reissue:
            args += [index[item.queue], item.queue, item.order_item_id, item.sku_id,
                     item.qty, item.time_ms, item.member_id]
        reply = [reply_text(part) for part in self.run(self.rebuild_script, keys, args)]
        raise_for(reply[0], f"rebuild of shard {shard}")
        return [parse_entry(entry) for entry in reply[1:]]
