"""How the keeper's renewal round reaches Redis: one ``renew_many`` call on one Redis
(`renew_in_one_call`); on a Redis Cluster one call per slot, pipelined (`renew_by_slot`).

A Redis Cluster refuses a script whose keys span slots (CROSSSLOT), and the keys of different
leases carry different hash tags. So the keeper's round is split: the due leases are grouped by
the slot of their key, each group is one ``renew_many`` EVALSHA, and each master gets its
slots' calls in one pipeline (one round trip per master). A group answered MOVED (the slot
moved; the client's slot table was stale) is sent again through the cluster client. A group
whose node lost the script (restart, failover, a new master) is run again after SCRIPT LOAD
on every master; a group answered TRYAGAIN (its slot is migrating and its keys are split
between two nodes) is retried lease by lease, one key per call, which a node can always serve.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import MovedError, NoScriptError, RedisError

from lease.scripts import TOKEN_CHARS, LeaseScripts

log = logging.getLogger("lease")

__all__ = ["group_by_slot", "is_cluster", "renew_by_slot", "renew_in_one_call", "renewer_for"]


def is_cluster(client: Any) -> bool:
    """True when `client` is a redis-py RedisCluster (its scripts must stay in one slot)."""
    return isinstance(client, RedisCluster)


def renew_in_one_call(scripts: LeaseScripts, keys: Sequence[bytes], tokens: Sequence[str],
                      ttls_ms: Sequence[str]) -> set[int]:
    """Renew the leases `keys` (their `tokens`, TTLs in ms as strings) in ONE script call on
    one Redis; return the positions whose token no longer matched (lost, left unchanged)."""
    refused = scripts.run(scripts.renew_many, keys,
                          [TOKEN_CHARS, "".join(tokens), ",".join(ttls_ms)])
    return {int(i) - 1 for i in refused}


def renewer_for(client: Any) -> Any:
    """`renew_by_slot` for a RedisCluster client, else `renew_in_one_call`."""
    return renew_by_slot if is_cluster(client) else renew_in_one_call


def group_by_slot(keys: Sequence[bytes]) -> dict[int, list[int]]:
    """The positions of `keys` by their cluster slot (hash tags respected), each group in the
    order of `keys`, the slots in the order of their first key."""
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        slot = key_slot(key)
        group = groups.get(slot)
        if group is None:
            groups[slot] = [i]
        else:
            group.append(i)
    return groups


def _args(positions: list[int], tokens: Sequence[str], ttls_ms: Sequence[str]) -> list[str | int]:
    return [TOKEN_CHARS, "".join([tokens[i] for i in positions]),
            ",".join([ttls_ms[i] for i in positions])]


def renew_by_slot(scripts: LeaseScripts, keys: Sequence[bytes], tokens: Sequence[str],
                  ttls_ms: Sequence[str]) -> set[int]:
    """Renew the leases `keys` (with their `tokens` and TTLs in ms, as strings) on the cluster
    client of `scripts`; return the positions whose token no longer matched (lost, left unchanged).

    Raises a redis error if a lease's renewal fails outright (the keeper's round then fails
    and is retried, as on one Redis)."""
    groups = group_by_slot(keys)
    replies = dict(zip(groups, _pipelined(scripts, groups, keys, tokens, ttls_ms), strict=True))
    missing = {slot: groups[slot] for slot, reply in replies.items()
               if isinstance(reply, NoScriptError)}
    if missing:
        # Masters without the script (a restart, a failover, a new master, the first round):
        # load it on every master once, then send those slots' calls again in one pipeline.
        script = scripts.renew_many
        script.sha = scripts.client.script_load(script.script)
        replies.update(zip(missing, _pipelined(scripts, missing, keys, tokens, ttls_ms),
                           strict=True))
    refused: set[int] = set()
    for slot, positions in groups.items():
        reply = replies[slot]
        if isinstance(reply, MovedError):
            # The slot moved (resharding, failover): the cluster client follows MOVED and
            # corrects its slot table, which the next round's routing reads.
            reply = scripts.run(scripts.renew_many, [keys[i] for i in positions],
                                _args(positions, tokens, ttls_ms))
        elif isinstance(reply, Exception):
            reply = _one_by_one(scripts, positions, keys, tokens, ttls_ms)
        refused.update(positions[int(i) - 1] for i in reply)
    return refused


def _one_by_one(scripts: LeaseScripts, positions: list[int], keys: Sequence[bytes],
                tokens: Sequence[str], ttls_ms: Sequence[str]) -> list[int]:
    """Renew one slot's leases one call each after the pipeline answered their group with an
    error (TRYAGAIN: the slot is migrating and the group's keys are split between two nodes;
    one key per call can always be served, the client following ASK to wherever the key is).
    Return the 1-based positions in the group that were refused; a redis error propagates."""
    return [n for n, i in enumerate(positions, 1)
            if scripts.run(scripts.renew_many, [keys[i]], _args([i], tokens, ttls_ms))]


def _pipelined(scripts: LeaseScripts, groups: dict[int, list[int]], keys: Sequence[bytes],
               tokens: Sequence[str], ttls_ms: Sequence[str]) -> list[Any]:
    """Send each slot's call to the master the client's slot table names for it, one plain
    pipeline per master; return the replies (errors included) in the order of `groups`.

    Plain node pipelines, not redis-py's cluster pipeline: that one blocks EVALSHA by name and,
    sent it raw, asks the server for every call's keys (COMMAND GETKEYS, one more round trip
    per call); told the node, it still took 37 ms for a 1000-slot round against 31 ms here.
    A stale slot table shows as MOVED replies, handled by the caller."""
    sha, client = scripts.renew_many.sha, scripts.client
    master_of = client.nodes_manager.get_node_from_slot
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for slot in groups:
        node = master_of(slot)
        by_node.setdefault(node.name, (node, []))[1].append(slot)
    replies: dict[int, Any] = {}
    for node, slots in by_node.values():
        try:
            with client.get_redis_connection(node).pipeline(transaction=False) as pipe:
                for slot in slots:
                    positions = groups[slot]
                    pipe.evalsha(sha, len(positions), *[keys[i] for i in positions],
                                 *_args(positions, tokens, ttls_ms))
                replies.update(zip(slots, pipe.execute(raise_on_error=False), strict=True))
        except RedisError:  # a connection error or timeout: replies carry the rest
            # A master is gone (failover, removed node): ask the cluster for its slots
            # again; this round fails and is retried, as on one Redis.
            _refresh_slots(client)
            raise
    return [replies[slot] for slot in groups]


def _refresh_slots(client: Any) -> None:
    """Reload the cluster client's slot table; if no node answers, the next round tries."""
    try:
        client.nodes_manager.initialize()
    except RedisError:
        log.debug("reloading the cluster's slots failed", exc_info=True)
