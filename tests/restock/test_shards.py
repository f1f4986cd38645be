"""Logical stock shards: the SKU -> shard mapping is fixed and spread, and shards share their
master's client, scripts and leases (shard N on master N % masters)."""

from __future__ import annotations

import zlib
from collections import Counter

import pytest
import redis
from redis.crc import key_slot

from tasks.config.settings import SettingsError
from tasks.restock.keys import deduct_keys, rebuild_keys, restock_keys, shard_tag, sync_keys
from tasks.restock.routing import Router, shard_of
from tasks.restock.settings import restock_settings
from tasks.restock.shards import close_shards, connect_shards, master_of
from tasks.wings import WINGS, load_settings
from tasks.worker.schedule import beat_schedule

# Pinned: a SKU's shard must never change for a given shard count (its stock, entries and
# database rows all say where it lives).
PINNED = {("sku-a", 16): 10, ("sku-d", 16): 5, ("sku-a", 64): 26, ("sku-0", 16): 8}


def test_the_mapping_is_crc32_modulo_the_shards_and_never_changes() -> None:
    for (sku, shards), shard in PINNED.items():
        assert shard_of(sku, shards) == shard == zlib.crc32(sku.encode()) % shards
    router = Router(shards=16, queues=("q0", "q1"))
    assert [router.shard_for(f"sku-{i}") for i in range(50)] == [
        Router(shards=16, queues=("q0",)).shard_for(f"sku-{i}") for i in range(50)]


def test_skus_spread_evenly_over_the_shards() -> None:
    counts = Counter(shard_of(f"sku-{i}", 16) for i in range(16_000))
    assert sorted(counts) == list(range(16))
    assert max(counts.values()) < 1.1 * 1000 and min(counts.values()) > 0.9 * 1000


def test_every_script_keeps_its_keys_in_its_shards_slot() -> None:
    for shard in (0, 7, 63):
        assert shard_tag(shard) == f"{{stock:{shard}}}"
        for keys in (deduct_keys(shard, "q0"), sync_keys(shard, "q1"),
                     restock_keys(shard, "q0"), rebuild_keys(shard, ["q0", "q1"])):
            assert {key_slot(k.encode()) for k in keys} == {key_slot(shard_tag(shard).encode())}
    with pytest.raises(ValueError, match="shard must be a non-negative integer"):
        shard_tag(-1)


def test_shards_are_spread_over_the_masters_and_share_their_clients() -> None:
    clients = [redis.Redis(port=1), redis.Redis(port=2), redis.Redis(port=3)]  # never dialled
    nodes = connect_shards(clients, 16)
    try:
        assert [n.number for n in nodes] == list(range(16))
        assert [clients.index(n.client) for n in nodes] == [master_of(i, 3) for i in range(16)]
        assert nodes[0].scripts is nodes[3].scripts and nodes[0].leases is nodes[15].leases
        assert nodes[0].scripts is not nodes[1].scripts
    finally:
        close_shards(nodes)
    with pytest.raises(ValueError, match="at least one client"):
        connect_shards([], 16)


def test_restock_shards_setting_and_one_beat_message_per_tick() -> None:
    assert restock_settings(load_settings({})).shards == 16
    assert restock_settings(load_settings({"RESTOCK_SHARDS": "64"})).shards == 64
    with pytest.raises(SettingsError, match="RESTOCK_SHARDS"):
        load_settings({"RESTOCK_SHARDS": "0"})
    schedule = beat_schedule(load_settings({"RESTOCK_INTERVAL": "0.5"}), WINGS)
    restock = [e for e in schedule.values() if "restock" in e["task"]]
    assert restock == [{"task": "tasks.restock.tick", "schedule": 0.5,
                        "options": {"expires": 1.0}}]
