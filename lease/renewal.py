"""How the keeper's renewal round reaches Redis: one ``renew_many`` call on one Redis
(`renew_in_one_call`); on a Redis Cluster one call per slot, pipelined (`renew_by_slot`).

A Redis Cluster refuses a script whose keys span slots (CROSSSLOT), and the keys of different
leases carry different hash tags. So the keeper's round is split: the due leases are grouped by
the slot of their key, each group is one ``renew_many`` EVALSHA, and all the groups go in one
cluster pipeline, which redis-py sends as one batch per master (one round trip per node, the
nodes written before any is read; MOVED and ASK replies are followed by redis-py). A group
whose node lost the script (restart, failover, a new master) is run again after SCRIPT LOAD
on every master; a group answered TRYAGAIN (its slot is migrating and its keys are split
between two nodes) is retried lease by lease, one key per call, which a node can always serve.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError

from lease.scripts import TOKEN_CHARS, LeaseScripts

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
        if isinstance(reply, Exception):
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
    # execute_command, not pipe.evalsha: redis-py blocks the named script methods in a cluster
    # pipeline. Each call names its slot's master (from the client's slot table): left to
    # route a raw EVALSHA itself, the pipeline asks the server for its keys (COMMAND GETKEYS),
    # one extra round trip per call. A stale table is corrected by the MOVED reply.
    sha, client = scripts.renew_many.sha, scripts.client
    master_of = client.nodes_manager.get_node_from_slot
    with client.pipeline() as pipe:
        for slot, positions in groups.items():
            pipe.execute_command("EVALSHA", sha, len(positions),
                                 *[keys[i] for i in positions], *_args(positions, tokens, ttls_ms),
                                 target_nodes=master_of(slot))
        return list(pipe.execute(raise_on_error=False))

