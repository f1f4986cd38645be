"""The Keeper in real time: its threads, one round trip per tick, loss within one TTL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from lease import Keeper, Leases
from tests.lease.conftest import FakeClock, heartbeating, wait_until
from tests.support.redis_server import RedisServer


@pytest.fixture
def private_client(private_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(private_redis.url)
    yield client
    client.close()


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_evalsha", {"calls": 0})
    return int(stats["calls"])


def test_one_thousand_leases_renewed_in_one_round_trip(
    private_client: redis.Redis, make_leases: Callable[..., Leases]
) -> None:
    clock = FakeClock()
    keeper = Keeper(private_client, clock=clock, threads=False)
    leases = make_leases(private_client, clock=clock, keeper=keeper)
    held = [leases.acquire(f"range:t:{i}", ttl=30.0) for i in range(1000)]
    held[0].heartbeat()
    clock.advance(10.0)
    assert keeper.tick() == 1  # the first call on a fresh server also loads the script
    pipe = private_client.pipeline(transaction=False)
    for lease in held:
        pipe.pexpire(lease._key, 5000)
    pipe.execute()
    for lease in held:
        lease.heartbeat()
    clock.advance(10.0)

    before = _evalsha_calls(private_client)
    assert keeper.tick() == 1000
    assert _evalsha_calls(private_client) - before == 1

    pipe = private_client.pipeline(transaction=False)
    for lease in held:
        pipe.pttl(lease._key)
    assert min(pipe.execute()) > 29_000


def test_deleted_key_is_reported_lost_within_one_ttl(
    leases: Leases, redis_client: redis.Redis
) -> None:
    ttl = 0.6
    lease = leases.acquire("gone", ttl=ttl)
    with heartbeating(lease):
        time.sleep(0.3)
        deleted = time.monotonic()
        redis_client.delete(lease._key)
        assert lease.lost_event.wait(ttl)
        assert time.monotonic() - deleted < ttl
    assert "refused" in (lease._lost_reason or "")


def test_dead_redis_is_reported_lost_within_one_ttl(
    private_redis: RedisServer, private_client: redis.Redis, make_leases: Callable[..., Leases]
) -> None:
    """The client retries for seconds on a dead server (redis-py's default Retry); the
    watchdog still reports the loss at safe-until."""
    ttl = 1.0
    leases = make_leases(private_client)
    lease = leases.acquire("dies", ttl=ttl)
    lost_in: list[str] = []
    lease.on_lost(lambda held: lost_in.append(threading.current_thread().name))
    with heartbeating(lease):
        time.sleep(0.5)
        killed = time.monotonic()
        private_redis.kill()
        assert lease.lost_event.wait(ttl + 1.0)
        reported = time.monotonic()
    # Lost at safe-until, which is within one TTL of the kill (it counts from the start of the
    # last renewal, before the kill); the notice lags it only by thread scheduling.
    assert lease.safe_until < killed + ttl
    assert lease.safe_until <= reported < lease.safe_until + 0.1
    # Callbacks run after the event is set, once, on a keeper thread: the watchdog at
    # safe-until, or the renewer if its failed round trip returns past safe-until first (a
    # loaded machine), never the holder's thread.
    assert wait_until(lambda: bool(lost_in), 2.0)
    assert len(lost_in) == 1 and lost_in[0] in ("lease-watchdog", "lease-renewer"), lost_in


def test_renewer_survives_an_outage_and_renews_after_restart(
    private_redis: RedisServer, make_leases: Callable[..., Leases]
) -> None:
    client = redis.Redis(
        port=private_redis.port, retry=Retry(ExponentialWithJitterBackoff(0.1, 0.01), 2)
    )
    leases = make_leases(client)
    before = leases.acquire("outage", ttl=0.5)
    workers = list(leases.keeper._workers)
    with heartbeating(before):
        assert wait_until(lambda: leases.stats()["renewed"] >= 1, 2.0)
        private_redis.kill()
        assert before.lost_event.wait(1.0)
        time.sleep(0.3)  # the renewer keeps failing for a while
    private_redis.start()  # same port, empty, no scripts loaded

    after = leases.acquire("outage", ttl=0.5)
    renewed = leases.stats()["renewed"]
    with heartbeating(after):
        assert wait_until(lambda: leases.stats()["renewed"] >= renewed + 3, 5.0)
        assert not after.lost
    assert leases.keeper._workers == workers and all(w.is_alive() for w in workers)
    assert leases.stats()["renewal_errors"] >= 1
    after.release()
    client.close()


def test_no_renewal_without_heartbeats(leases: Leases, redis_client: redis.Redis) -> None:
    lease = leases.acquire("hung", ttl=0.4)
    assert lease.lost_event.wait(1.0)
    assert leases.stats()["renewed"] == 0
    assert wait_until(lambda: not redis_client.exists(lease._key), 0.5)
    assert leases.acquire("hung", ttl=0.4).fence == lease.fence + 1


def test_heartbeats_keep_a_lease_for_many_ttls(leases: Leases, redis_client: redis.Redis) -> None:
    lease = leases.acquire("busy", ttl=0.3)
    with heartbeating(lease):
        time.sleep(1.2)
        assert not lease.lost
    stats = leases.stats()
    assert stats["renewed"] >= 3 and stats["renew_rtt_max_ms"] > 0
    margin = stats["renew_margin_min_ms"]
    assert margin is not None and 0 < margin < 300
    lease.release()


def test_heartbeat_wakes_a_renewer_waiting_for_progress(leases: Leases) -> None:
    lease = leases.acquire("wake", ttl=0.9)
    time.sleep(0.45)  # due at 0.3 s, but no progress: the renewer waits for a heartbeat
    assert leases.stats()["renewed"] == 0
    lease.heartbeat()
    assert wait_until(lambda: leases.stats()["renewed"] == 1, 0.2)
    lease.release()


def test_max_lifetime_ends_a_busy_lease(leases: Leases, redis_client: redis.Redis) -> None:
    start = time.monotonic()
    lease = leases.acquire("life", ttl=0.3, max_lifetime=0.7)
    with heartbeating(lease):
        assert lease.lost_event.wait(2.0)
    assert 0.6 < time.monotonic() - start < 1.0
    assert wait_until(lambda: not redis_client.exists(lease._key), 0.1)  # gone by acquire + 0.7
    assert leases.stats()["renewed"] >= 2


def test_release_stops_renewal_at_once(leases: Leases) -> None:
    lease = leases.acquire("stop", ttl=0.3)
    with heartbeating(lease):
        assert wait_until(lambda: leases.stats()["renewed"] >= 1, 1.0)
        lease.release()
        renewed = leases.stats()["renewed"]
        assert leases.keeper.held() == []
        time.sleep(0.4)
    assert leases.stats()["renewed"] == renewed and not lease.lost


def test_keeper_threads_start_lazily_and_idle(redis_client: redis.Redis) -> None:
    keeper = Keeper(redis_client)
    leases = Leases(redis_client, keeper=keeper)
    assert keeper._workers == []
    lease = leases.acquire("lazy", ttl=5.0)
    assert [w.name for w in keeper._workers] == ["lease-renewer", "lease-watchdog"]
    lease.release()
    time.sleep(0.05)
    assert all(w.is_alive() for w in keeper._workers)  # idle, not spinning or gone
    old = list(keeper._workers)
    keeper.stop()
    assert keeper._workers == [] and not any(w.is_alive() for w in old)
    leases.acquire("again", ttl=5.0)  # a new lease starts a new pair of threads
    assert len(keeper._workers) == 2 and keeper._workers != old
    keeper.stop()


def test_a_lease_without_progress_lives_as_long_as_its_keeper(
    leases: Leases, redis_client: redis.Redis
) -> None:
    lease = leases.acquire("alive", ttl=0.3, progress=False)
    time.sleep(1.2)  # four TTLs, not one heartbeat
    assert not lease.lost and redis_client.pttl(lease._key) > 0
    assert leases.stats()["renewed"] >= 3
    leases.keeper.stop()  # the process "dies": nothing renews it any more
    assert wait_until(lambda: not redis_client.exists(lease._key), 1.0)
