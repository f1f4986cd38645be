"""tasks.config.redisconn: every URL form builds the right client; bad forms are refused, naming the
variable; a Sentinel client follows a real failover; a cluster client reaches every master."""

from __future__ import annotations

import time

import pytest
import redis
from redis.cluster import RedisCluster

from tasks.celery import configure
from tasks.config.redisconn import redis_client
from tasks.config.settings import SettingsError
from tasks.wings import load_settings
from tests.support.redis_cluster import redis_cluster
from tests.support.redis_sentinel import MASTER_NAME, sentinel_group

SENTINELS = "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380"
SEPARATE_BROKER = {"BROKER_URL": "redis://b:6379/0", "RESULT_BACKEND": "redis://b:6379/1"}


def test_a_plain_url_builds_a_redis_client(redis_url: str) -> None:
    client = redis_client(redis_url, socket_timeout=5)
    assert type(client) is redis.Redis
    assert client.ping()
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 5


def test_a_sentinel_url_builds_a_master_client_with_the_urls_password_and_db() -> None:
    client = redis_client("sentinel://:s3cret@127.0.0.1:26379/2;sentinel://127.0.0.1:26380",
                          sentinel_master="mymaster", socket_timeout=1)
    pool = client.connection_pool
    assert pool.service_name == "mymaster"  # type: ignore[attr-defined]
    assert pool.connection_kwargs["password"] == "s3cret"
    assert pool.connection_kwargs["db"] == 2
    sentinels = pool.sentinel_manager.sentinels  # type: ignore[attr-defined]
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26380]
    # The password is the master's, not the sentinels' (as kombu reads it).
    assert sentinels[0].connection_pool.connection_kwargs.get("password") is None


@pytest.mark.parametrize(("url", "nodes", "master", "message"), [
    (SENTINELS, (), None, "SENTINEL_MASTER"),
    ("sentinel://127.0.0.1;sentinel://h:1", (), "m", "sentinel://host:port"),
    ("sentinel://h:1;redis://h:2", (), "m", "sentinel://host:port"),
    ("redis://127.0.0.1/3", ("127.0.0.1:7000",), None, "only database 0"),
    ("redis://127.0.0.1/?db=1", ("127.0.0.1:7000",), None, "only database 0"),
    ("redis://127.0.0.1", ("127.0.0.1",), None, "host:port"),
    ("unix:///tmp/r.sock", ("127.0.0.1:7000",), None, "redis:// or rediss://"),
    (SENTINELS, ("127.0.0.1:7000",), "m", "cannot both"),
])
def test_bad_forms_are_refused(url: str, nodes: tuple[str, ...], master: str | None,
                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        redis_client(url, cluster_nodes=nodes, sentinel_master=master)


@pytest.mark.parametrize(("env", "message"), [
    ({"REDIS_URL": SENTINELS}, "REDIS_URL is a sentinel:// URL: set SENTINEL_MASTER"),
    ({"BROKER_URL": SENTINELS}, "BROKER_URL is a sentinel:// URL"),
    ({"RESULT_BACKEND": SENTINELS}, "RESULT_BACKEND is a sentinel:// URL"),
    ({"BROKER_URL": "sentinel://:pw@h:1;redis://h:2", "SENTINEL_MASTER": "m"},
     "BROKER_URL=.*sentinel://host:port"),
    ({"REDIS_CLUSTER_NODES": "127.0.0.1:7000,localhost"}, "REDIS_CLUSTER_NODES=.*host:port"),
    ({"REDIS_CLUSTER_NODES": "127.0.0.1:7000,"}, "REDIS_CLUSTER_NODES=.*no empty entry"),
    # Not "pw": a password from the README's examples is refused first (a shipped secret).
    ({"REDIS_CLUSTER_NODES": "h:7000", "REDIS_URL": "redis://:pw9Qz7@h/4", **SEPARATE_BROKER},
     "REDIS_URL=.*only database 0"),
    ({"REDIS_CLUSTER_NODES": "h:7000", "REDIS_URL": SENTINELS, "SENTINEL_MASTER": "m",
      **SEPARATE_BROKER}, "REDIS_URL=.*must be redis:// or rediss://"),
    ({"SENTINEL_MASTER": "my master"}, "SENTINEL_MASTER="),
    ({"REDIS_CLUSTER_NODES": "h:7000"}, "REDIS_CLUSTER_NODES is set: set BROKER_URL too"),
    ({"REDIS_CLUSTER_NODES": "h:7000", "BROKER_URL": "amqp://h//"},
     "REDIS_CLUSTER_NODES is set: set RESULT_BACKEND too"),
])
def test_settings_refuse_bad_forms_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as caught:
        load_settings(env)
    assert "pw" not in str(caught.value) and "9Qz7" not in str(caught.value)


def test_settings_accept_sentinel_for_leases_broker_and_backend() -> None:
    settings = load_settings({"REDIS_URL": SENTINELS, "SENTINEL_MASTER": "mymaster"})
    assert settings.broker_url == settings.result_backend == SENTINELS
    conf = configure(settings)
    assert conf["broker_transport_options"]["master_name"] == "mymaster"
    assert conf["result_backend_transport_options"]["master_name"] == "mymaster"
    # The visibility timeout entries stay where they were.
    assert conf["broker_transport_options"]["visibility_timeout"] == settings.visibility_timeout
    plain = configure(load_settings({"REDIS_URL": "redis://127.0.0.1:6379/0"}))
    assert "master_name" not in plain["broker_transport_options"]


def test_cluster_nodes_build_a_cluster_client_that_reaches_every_master() -> None:
    with redis_cluster(masters=3) as cluster:
        settings = load_settings({"REDIS_CLUSTER_NODES": cluster.seeds,
                                  "REDIS_URL": "redis://127.0.0.1:6379/0",
                                  "BROKER_URL": "redis://127.0.0.1:6379/0",
                                  "RESULT_BACKEND": "redis://127.0.0.1:6379/0"})
        client = redis_client(settings.redis_url, cluster_nodes=settings.redis_cluster_nodes)
        assert isinstance(client, RedisCluster)
        for i in range(60):
            client.set(f"k:{i}", i)
        assert [int(client.get(f"k:{i}") or -1) for i in range(60)] == list(range(60))
        owners = {cluster.owner_of(client.keyslot(f"k:{i}")) for i in range(60)}
        assert owners == {0, 1, 2}
        client.close()


def test_a_sentinel_client_follows_a_failover() -> None:
    with sentinel_group() as group:
        client = redis_client(group.sentinel_urls, sentinel_master=MASTER_NAME,
                              socket_timeout=1, socket_connect_timeout=1)
        client.set("before", "1")
        client.wait(1, 2000)  # replicated before the kill: this key must survive
        old = group.master_address()
        seconds = group.kill_master()
        print(f"sentinel failover: a new master named after {seconds:.1f}s")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.set("after", "2")
                break
            except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
                assert time.monotonic() < deadline, "the client never reached the new master"
                time.sleep(0.2)
        assert group.master_address() != old
        assert client.get("before") == b"1"
        assert client.get("after") == b"2"
        client.close()


def test_a_lease_on_sentinel_rides_out_a_failover_shorter_than_its_ttl() -> None:
    from lease import Leases, NotAcquired
    from tests.lease.conftest import heartbeating

    with sentinel_group() as group:
        client = redis_client(group.sentinel_urls, sentinel_master=MASTER_NAME,
                              socket_timeout=1, socket_connect_timeout=1)
        leases = Leases(client)
        try:
            lease = leases.acquire("ride", ttl=8.0)
            client.wait(1, 2000)  # the replica has the lease: a failover keeps it
            with heartbeating(lease):
                renewed = leases.stats()["renewed"]
                group.kill_master()
                deadline = time.monotonic() + 20
                while leases.stats()["renewed"] <= renewed + 1:  # renewed on the new master
                    assert time.monotonic() < deadline, leases.stats()
                    time.sleep(0.1)
                lease.check()
            with pytest.raises(NotAcquired):
                leases.acquire("ride", ttl=8.0)
            lease.release()
            # A store passes its newest fence as the floor: a fence never repeats, even if the
            # promoted replica had missed the counter's last INCR.
            assert leases.acquire("ride", ttl=8.0, fence_floor=lease.fence).fence > lease.fence
        finally:
            leases.close()
            client.close()
