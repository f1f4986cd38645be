"""The keeper's renewal and expiry rules, driven by a fake clock through Keeper.tick().

Redis is real (the leases are real keys); only time is fake, so nothing here sleeps. With
TTL 3 s and drift 0.01 a lease is due 1 s after its last renewal, rides along with a tick from
0.5 s, and is safe until 3 s - 35 ms after the start of its last confirmed round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from lease import Keeper, Lease, LeaseLost, Leases
from lease.keys import lease_key
from tests.lease.conftest import FakeClock, RoundTrips

TTL = 3.0
SAFE = TTL - (TTL * 0.01 + 0.005)  # 2.965


def _delete(client: redis.Redis, lease: Lease) -> None:
    client.delete(lease._key)


def _steal(client: redis.Redis, lease: Lease) -> None:
    client.set(lease._key, "someone-else", px=10_000)


@pytest.mark.parametrize(
    ("advance", "heartbeat", "renew", "tamper", "renewed", "lost"),
    [
        pytest.param(0.4, True, True, None, 0, False, id="not-due"),
        pytest.param(0.5, True, True, None, 1, False, id="ripe-rides-along"),
        pytest.param(1.0, True, True, None, 1, False, id="due-with-heartbeat"),
        pytest.param(2.9, True, True, None, 1, False, id="late-but-safe"),
        pytest.param(1.0, False, True, None, 0, False, id="due-without-heartbeat"),
        pytest.param(2.9, False, True, None, 0, False, id="no-heartbeat-still-safe"),
        pytest.param(SAFE, False, True, None, 0, True, id="safe-until-passed"),
        pytest.param(SAFE, True, True, None, 0, True, id="heartbeat-too-late"),
        pytest.param(1.0, True, True, _delete, 0, True, id="refused-key-gone"),
        pytest.param(1.0, True, True, _steal, 0, True, id="refused-other-holder"),
        pytest.param(1.0, True, False, None, 0, False, id="renew-false-not-renewed"),
        pytest.param(SAFE, True, False, None, 0, True, id="renew-false-lapses"),
    ],
)
def test_tick(
    fake_leases: Leases,
    clock: FakeClock,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    advance: float,
    heartbeat: bool,
    renew: bool,
    tamper: Callable[[redis.Redis, Lease], None] | None,
    renewed: int,
    lost: bool,
) -> None:
    lease = fake_leases.acquire("t", ttl=TTL, renew=renew)
    start = clock.now
    redis_client.pexpire(lease._key, 2000)  # so a renewal shows in Redis
    if tamper:
        tamper(redis_client, lease)
    value = redis_client.get(lease._key)
    if heartbeat:
        lease.heartbeat()
    trips = RoundTrips(fake_leases, monkeypatch)
    calls: list[Lease] = []
    lease.on_lost(calls.append)
    clock.advance(advance)

    assert fake_leases.keeper.tick() == renewed

    assert len(trips) == (1 if renewed or tamper else 0)
    assert lease.lost is lost and lease.lost_event.is_set() is lost
    assert calls == ([lease] if lost else [])
    assert fake_leases.keeper.held() == ([] if lost else [lease])
    assert redis_client.get(lease._key) == value  # the keeper never writes someone else's key
    if renewed:
        assert lease.safe_until == pytest.approx(clock.now + SAFE)
        assert redis_client.pttl(lease._key) > 2900
    elif not lost:
        assert lease.safe_until == pytest.approx(start + SAFE)
        assert redis_client.pttl(lease._key) <= 2000


def test_heartbeat_is_consumed_by_a_renewal(fake_leases: Leases, clock: FakeClock) -> None:
    lease = fake_leases.acquire("hb", ttl=TTL)
    lease.heartbeat()
    clock.advance(1.0)
    assert fake_leases.keeper.tick() == 1
    clock.advance(1.0)
    assert fake_leases.keeper.tick() == 0  # no progress since the last renewal
    lease.heartbeat()
    assert fake_leases.keeper.tick() == 1


def test_one_round_trip_renews_every_due_lease(
    fake_leases: Leases, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    early = [fake_leases.acquire(f"e{i}", ttl=TTL) for i in range(3)]
    clock.advance(0.6)
    late = [fake_leases.acquire(f"l{i}", ttl=TTL) for i in range(2)]  # not ripe yet
    idle = fake_leases.acquire("idle", ttl=TTL)  # no heartbeat
    for lease in early + late:
        lease.heartbeat()
    trips = RoundTrips(fake_leases, monkeypatch)
    clock.advance(0.4)
    assert fake_leases.keeper.tick() == 3
    assert trips.calls == [3]
    assert not idle.lost


@pytest.mark.parametrize(
    ("steps", "renewals", "lost_at"),
    [
        # max lifetime 2.5 s, TTL 3 s: the first TTL is 2.5 s; renewals ask only for what is
        # left of the lifetime, and the lease is lost just before acquire + 2.5 s.
        pytest.param([1.0, 2.0, 2.3], [1.5, 0.5, None], 2.49, id="capped-renewals"),
        # A renewal asked for when nothing useful is left is not made at all.
        pytest.param([1.0, 2.49], [1.5, None], 2.49, id="nothing-left"),
    ],
)
def test_max_lifetime(
    fake_leases: Leases,
    clock: FakeClock,
    redis_client: redis.Redis,
    steps: list[float],
    renewals: list[float | None],
    lost_at: float,
) -> None:
    lease = fake_leases.acquire("ml", ttl=TTL, max_lifetime=2.5)
    start = clock.now
    assert lease.safe_until <= start + 2.5
    for at, ttl in zip(steps, renewals, strict=True):
        lease.heartbeat()
        clock.now = start + at
        renewed = fake_leases.keeper.tick()
        assert renewed == (ttl is not None)
        if ttl is not None:
            assert lease.safe_until == pytest.approx(start + at + ttl - ttl * 0.01 - 0.005)
            assert redis_client.pttl(lease_key("ml")) <= ttl * 1000
        assert lease.safe_until <= start + 2.5
    clock.now = start + lost_at
    lease.heartbeat()
    fake_leases.keeper.tick()
    assert lease.lost


def test_max_lifetime_refuses_direct_renew(
    redis_client: redis.Redis, make_leases: Callable[..., Leases], clock: FakeClock
) -> None:
    leases = make_leases(
        redis_client, clock=clock, drift=0.0, keeper=Keeper(redis_client, clock, threads=False)
    )
    lease = leases.acquire("mld", ttl=1.0, max_lifetime=1.0)  # safe until +0.995
    clock.advance(0.9945)  # still safe, but under FIXED_MARGIN + MIN_WAIT of lifetime left
    lease.check()
    with pytest.raises(LeaseLost, match="max lifetime"):
        lease.renew()


def test_confirmation_after_safe_until_is_a_loss(
    fake_leases: Leases, clock: FakeClock, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis renewed it, but the reply came after safe-until: the holder may already have
    stopped, so the lease stays lost rather than coming back."""
    lease = fake_leases.acquire("late", ttl=TTL)
    lease.heartbeat()
    keeper = fake_leases.keeper
    real = keeper._do_renew_many

    def slow(batch: Any) -> set[int]:
        clock.advance(2.0)  # the round trip takes 2 s
        return real(batch)

    monkeypatch.setattr(keeper, "_do_renew_many", slow)
    clock.advance(1.0)
    assert keeper.tick() == 0
    assert lease.lost and "before the renewal was confirmed" in (lease._lost_reason or "")
    assert redis_client.get(lease._key) == lease.token.encode()


def test_safe_until_counts_from_round_trip_start(
    fake_leases: Leases, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = fake_leases.acquire("start", ttl=TTL)
    lease.heartbeat()
    keeper = fake_leases.keeper
    real = keeper._do_renew_many

    def slow(batch: Any) -> set[int]:
        clock.advance(0.3)
        return real(batch)

    monkeypatch.setattr(keeper, "_do_renew_many", slow)
    clock.advance(1.0)
    started = clock.now
    assert keeper.tick() == 1
    assert lease.safe_until == pytest.approx(started + SAFE)


def test_redis_error_is_retried_until_safe_until(
    fake_leases: Leases, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = fake_leases.acquire("err", ttl=TTL)
    keeper = fake_leases.keeper
    real = keeper._do_renew_many

    def down(batch: Any) -> set[int]:
        raise redis.ConnectionError("down")

    monkeypatch.setattr(keeper, "_do_renew_many", down)
    lease.heartbeat()
    clock.advance(1.0)
    assert keeper.tick() == 0 and not lease.lost
    clock.advance(1.0)
    assert keeper.tick() == 0 and not lease.lost
    monkeypatch.setattr(keeper, "_do_renew_many", real)
    assert keeper.tick() == 1  # back: the heartbeat was not used up by the failures
    monkeypatch.setattr(keeper, "_do_renew_many", down)
    lease.heartbeat()
    clock.advance(SAFE)
    assert keeper.tick() == 0 and lease.lost
    stats = fake_leases.stats()
    assert (stats["renewal_errors"], stats["renewal_failures"], stats["lost"]) == (2, 2, 1)


def test_released_lease_is_not_renewed(
    fake_leases: Leases, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = fake_leases.acquire("rel", ttl=TTL)
    lease.heartbeat()
    lease.release()
    trips = RoundTrips(fake_leases, monkeypatch)
    clock.advance(1.0)
    assert fake_leases.keeper.tick() == 0
    clock.advance(SAFE)
    fake_leases.keeper.tick()
    assert len(trips) == 0 and not lease.lost


def test_release_racing_a_tick_is_not_reported_lost(
    fake_leases: Leases, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder releases while a renewal is in flight: the refusal that follows is ignored."""
    lease = fake_leases.acquire("race", ttl=TTL)
    lease.heartbeat()
    keeper = fake_leases.keeper
    real = keeper._do_renew_many

    def release_first(batch: Any) -> set[int]:
        lease.release()
        return real(batch)

    monkeypatch.setattr(keeper, "_do_renew_many", release_first)
    clock.advance(1.0)
    assert keeper.tick() == 0
    assert not lease.lost and fake_leases.stats()["lost"] == 0
