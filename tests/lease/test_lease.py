"""Acquire, renew, release and the token checks, against the real test Redis."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis

from lease import Keeper, LeaseError, LeaseLost, Leases, NotAcquired, NotHeld
from lease.keys import fence_key, lease_key, waiting_key, wake_key
from tests.lease.conftest import FakeClock, RoundTrips


def test_acquire_sets_token_and_fence_under_one_hash_tag(
    leases: Leases, redis_client: redis.Redis
) -> None:
    lease = leases.acquire("range:cm_data:3", ttl=2.0)
    assert lease_key("range:cm_data:3") == "lease:{range:cm_data:3}"
    assert fence_key("range:cm_data:3") == "fence:{range:cm_data:3}"
    assert redis_client.get("lease:{range:cm_data:3}") == lease.token.encode()
    assert 1500 < redis_client.pttl("lease:{range:cm_data:3}") <= 2000
    assert redis_client.get("fence:{range:cm_data:3}") == b"1"
    assert redis_client.ttl("fence:{range:cm_data:3}") == -1  # the fence never expires
    assert (lease.name, lease.fence, lease.ttl) == ("range:cm_data:3", 1, 2.0)
    assert len(lease.token) == 32 and not lease.lost


def test_fence_strictly_increases_across_holders(leases: Leases) -> None:
    fences = []
    for _ in range(5):
        with leases.acquire("f", ttl=1.0) as lease:
            assert leases.current_fence("f") == lease.fence
            fences.append(lease.fence)
    assert fences == [1, 2, 3, 4, 5]
    assert leases.current_fence("never-acquired") == 0


@pytest.mark.parametrize("blocking", [False, True])
def test_fence_ttl_bounds_the_fence_key_and_floor_still_holds(
    leases: Leases, redis_client: redis.Redis, blocking: bool
) -> None:
    with leases.acquire("ft", ttl=2.0, fence_ttl=5.0, blocking=blocking) as first:
        assert first.fence == 1
        assert 4000 < redis_client.pttl(fence_key("ft")) <= 5000
    with leases.acquire("ft", ttl=2.0, fence_ttl=0.2, fence_floor=7) as second:
        assert second.fence == 8  # SET past the floor, then the TTL again
        assert 0 < redis_client.pttl(fence_key("ft")) <= 200
    with pytest.raises(ValueError):
        leases.acquire("ft", ttl=2.0, fence_ttl=0.0)


def test_second_acquire_is_refused(leases: Leases) -> None:
    first = leases.acquire("busy", ttl=5.0)
    with pytest.raises(NotAcquired) as refused:
        leases.acquire("busy", ttl=5.0)
    assert isinstance(refused.value, LeaseError) and refused.value.name == "busy"
    assert leases.current_fence("busy") == first.fence  # a refused acquire takes no fence


def test_release_deletes_and_a_second_release_is_not_held(
    leases: Leases, redis_client: redis.Redis
) -> None:
    lease = leases.acquire("r", ttl=5.0)
    lease.release()
    assert not redis_client.exists(lease_key("r"))
    assert not redis_client.exists(wake_key("r"))  # nobody waited: no wake-up work
    assert not lease.lost
    with pytest.raises(NotHeld):
        lease.release()
    with pytest.raises(NotHeld):
        lease.renew()
    with pytest.raises(NotHeld):
        lease.check()
    assert leases.acquire("r", ttl=1.0).fence == 2


def test_release_after_someone_else_took_it_is_lease_lost(
    leases: Leases, redis_client: redis.Redis
) -> None:
    lease = leases.acquire("expired", ttl=5.0, renew=False)
    redis_client.set(lease_key("expired"), "other-token", px=5000)
    lost: list[str] = []
    lease.on_lost(lambda held: lost.append(held.name))
    with pytest.raises(LeaseLost):
        lease.release()
    assert redis_client.get(lease_key("expired")) == b"other-token"  # untouched
    assert lease.lost and lease.lost_event.is_set() and lost == ["expired"]


@pytest.mark.parametrize("operation", ["renew", "release"])
def test_wrong_token_changes_nothing(
    leases: Leases, redis_client: redis.Redis, operation: str
) -> None:
    """A renew or release by a stale holder (wrong token) leaves value, TTL and fence alone."""
    mine = leases.acquire("guarded", ttl=5.0, renew=False)
    stale = leases.acquire("other", ttl=5.0, renew=False)  # a real Lease, for its methods
    stale._key = mine._key  # ...now aimed at "guarded" with the wrong token
    stale.name = "guarded"
    redis_client.pexpire(mine._key, 3000)
    before = redis_client.pttl(mine._key)
    snapshot = {k: redis_client.dump(k) for k in redis_client.keys("*")}

    with pytest.raises(LeaseLost):
        getattr(stale, operation)()

    assert redis_client.get(mine._key) == mine.token.encode()
    assert before - 100 < redis_client.pttl(mine._key) <= before  # not extended, not deleted
    assert {k: redis_client.dump(k) for k in redis_client.keys("*")} == snapshot
    assert leases.current_fence("guarded") == mine.fence


def test_scripts_take_every_key_in_keys(leases: Leases, monkeypatch: pytest.MonkeyPatch) -> None:
    trips = RoundTrips(leases, monkeypatch)
    lease = leases.acquire("k", ttl=5.0)
    lease.renew()
    lease.release()
    assert trips.calls == [2, 1, 3]  # lease+fence; lease; lease+waiting+wake


def test_context_manager_releases_and_swallows_only_when_lost(
    fake_leases: Leases, clock: FakeClock, redis_client: redis.Redis
) -> None:
    with fake_leases.acquire("cm", ttl=5.0) as lease:
        pass
    assert not redis_client.exists(lease_key("cm"))

    with pytest.raises(LeaseLost), fake_leases.acquire("cm", ttl=5.0) as lease:
        redis_client.delete(lease_key("cm"))
        clock.advance(5.0)  # past safe-until: lost locally
        lease.check()
    assert lease.lost

    with pytest.raises(NotHeld), fake_leases.acquire("cm", ttl=5.0) as lease:
        lease.release()  # released inside, not lost: the exit's NotHeld is not swallowed

    with pytest.raises(LeaseLost), fake_leases.acquire("cm", ttl=5.0) as lease:
        redis_client.set(lease_key("cm"), "thief", px=5000)  # the exit's release finds out
    assert redis_client.get(lease_key("cm")) == b"thief"


def test_check_and_lost_follow_safe_until(fake_leases: Leases, clock: FakeClock) -> None:
    lease = fake_leases.acquire("su", ttl=2.0)  # drift 0.01: safe until +2 - 0.025
    assert lease.safe_until == pytest.approx(clock.now + 2.0 - 0.025)
    clock.advance(1.97)
    lease.check()
    assert not lease.lost
    clock.advance(0.01)
    assert lease.lost and not lease.lost_event.is_set()  # the keeper has not run yet
    with pytest.raises(LeaseLost):
        lease.check()
    fake_leases.keeper.tick()
    assert lease.lost_event.is_set()


def test_direct_renew_extends_from_the_round_trip_start(
    fake_leases: Leases, clock: FakeClock, redis_client: redis.Redis
) -> None:
    lease = fake_leases.acquire("dr", ttl=3.0)
    redis_client.pexpire(lease._key, 1000)
    clock.advance(1.0)
    lease.renew()
    assert lease.safe_until == pytest.approx(clock.now + 3.0 - 0.035)
    assert redis_client.pttl(lease._key) > 2900


def test_direct_renew_refused_marks_lost(
    fake_leases: Leases, redis_client: redis.Redis
) -> None:
    lease = fake_leases.acquire("drr", ttl=3.0)
    redis_client.delete(lease._key)
    with pytest.raises(LeaseLost):
        lease.renew()
    assert lease.lost_event.is_set()
    with pytest.raises(LeaseLost):
        lease.renew()  # lost is final


def test_on_lost_runs_at_once_when_already_lost_and_logs_failures(
    fake_leases: Leases, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    lease = fake_leases.acquire("cb", ttl=1.0)
    seen: list[str] = []

    def boom(_: object) -> None:
        raise RuntimeError("callback bug")

    lease.on_lost(boom)
    lease.on_lost(lambda held: seen.append("first"))
    clock.advance(1.0)
    with caplog.at_level(logging.WARNING, logger="lease"):
        fake_leases.keeper.tick()
    assert seen == ["first"]
    assert any("callback" in r.getMessage() and r.exc_info for r in caplog.records)
    lease.on_lost(lambda held: seen.append("late"))
    assert seen == ["first", "late"]


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("", {}),
        ("has{brace", {}),
        ("has}brace", {}),
        ("{}empty-tag", {}),
        ("{tag}then{more}", {}),
        ("x{tag}", {}),
        ("ok", {"ttl": 0.001}),
        ("ok", {"ttl": float("nan")}),
        ("ok", {"timeout": 1.0}),  # a timeout needs blocking=True
        ("ok", {"blocking": True, "timeout": -1.0}),
        ("ok", {"max_lifetime": 0.0}),
    ],
)
def test_bad_arguments_are_refused(leases: Leases, name: str, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        leases.acquire(name, **kwargs)  # type: ignore[arg-type]


def test_leases_and_keeper_must_share_a_clock(
    redis_client: redis.Redis, make_leases: Callable[..., Leases]
) -> None:
    with pytest.raises(ValueError):
        make_leases(redis_client, clock=FakeClock(), keeper=Keeper(redis_client, threads=False))
    with pytest.raises(ValueError):
        make_leases(redis_client, drift=0.5)


def test_max_lifetime_caps_the_first_ttl(leases: Leases, redis_client: redis.Redis) -> None:
    leases.acquire("cap", ttl=10.0, max_lifetime=1.0)
    assert redis_client.pttl(lease_key("cap")) <= 1000


def test_stats_counters_move(
    fake_leases: Leases, clock: FakeClock, redis_client: redis.Redis
) -> None:
    lease = fake_leases.acquire("s", ttl=3.0)
    with pytest.raises(NotAcquired):
        fake_leases.acquire("s", ttl=3.0)
    lease.heartbeat()
    clock.advance(1.0)
    assert fake_leases.keeper.tick() == 1
    lease.renew()
    lease.release()
    other = fake_leases.acquire("t", ttl=3.0)
    redis_client.delete(other._key)
    other.heartbeat()
    clock.advance(1.0)
    fake_leases.keeper.tick()
    stats = fake_leases.stats()
    assert {k: stats[k] for k in (
        "acquired", "contended", "renewed", "renewal_failures", "renewal_errors", "lost",
        "released", "ticks", "held",
    )} == {
        "acquired": 2, "contended": 1, "renewed": 2, "renewal_failures": 1, "renewal_errors": 0,
        "lost": 1, "released": 1, "ticks": 2, "held": 0,
    }
    assert stats["renew_rtt_max_ms"] == 0.0  # the fake clock stood still during round trips
    # Least time left before safe-until at a confirmed renewal: the tick at +1 s.
    assert stats["renew_margin_min_ms"] == pytest.approx(3000 - 35 - 1000, abs=1)


def test_waiting_flag_only_from_blocking_acquirers(
    leases: Leases, redis_client: redis.Redis
) -> None:
    holder = leases.acquire("w", ttl=5.0)
    with pytest.raises(NotAcquired):
        leases.acquire("w", ttl=5.0)
    assert not redis_client.exists(waiting_key("w"))
    with pytest.raises(NotAcquired):
        leases.acquire("w", ttl=5.0, blocking=True, timeout=0)
    assert redis_client.exists(waiting_key("w"))
    holder.release()
    assert redis_client.lrange(wake_key("w"), 0, -1) == [b"1"]
    assert 0 < redis_client.pttl(wake_key("w")) <= 1000


def test_a_fence_floor_lifts_a_lost_counter_past_every_used_fence(
    redis_client: redis.Redis,
) -> None:
    leases = Leases(redis_client)
    try:
        first = leases.acquire("floor:demo", ttl=5.0)
        first.release()
        redis_client.flushdb()  # Redis lost the counter: the next plain acquire would get 1 again
        lifted = leases.acquire("floor:demo", ttl=5.0, fence_floor=41)
        assert lifted.fence == 42
        lifted.release()
        assert leases.acquire("floor:demo", ttl=5.0, fence_floor=3).fence == 43  # never lowered
    finally:
        leases.close()


def test_a_name_may_carry_its_own_hash_tag(leases: Leases, redis_client: redis.Redis) -> None:
    """`{node:3}:q1` puts the lease in the slot of the other `{node:3}` keys."""
    lease = leases.acquire("{node:3}:q1", ttl=5.0)
    assert redis_client.get("lease:{node:3}:q1") == lease.token.encode()
    assert int(redis_client.get("fence:{node:3}:q1") or 0) == lease.fence
    assert lease_key("{node:3}:q1") == "lease:{node:3}:q1"
    assert waiting_key("{node:3}:q1") == "lease-waiting:{node:3}:q1"
    assert wake_key("{node:3}:q1") == "lease-wake:{node:3}:q1"
    assert leases.current_fence("{node:3}:q1") == lease.fence
    lease.release()
    assert redis_client.exists("lease:{node:3}:q1") == 0


def test_revoke_ends_only_the_lease_of_that_fence(leases: Leases,
                                                  redis_client: redis.Redis) -> None:
    gone = leases.acquire("r", ttl=30.0)
    assert not leases.revoke("r", gone.fence + 1)  # not its fence: nothing changes
    assert redis_client.get(lease_key("r")) == gone.token.encode()
    assert leases.revoke("r", gone.fence)
    assert redis_client.exists(lease_key("r")) == 0
    assert not leases.revoke("r", gone.fence)  # free: stays free
    later = leases.acquire("r", ttl=30.0)  # at once, not after the 30 s TTL
    assert later.fence == gone.fence + 1
    assert not leases.revoke("r", gone.fence)  # a later holder keeps its lease
    assert redis_client.get(lease_key("r")) == later.token.encode()
    with pytest.raises(LeaseLost):
        gone.release()  # the gone holder's own release is refused
    later.release()


def test_revoke_wakes_a_blocked_waiter(leases: Leases, redis_client: redis.Redis) -> None:
    gone = leases.acquire("w", ttl=30.0)
    redis_client.set(waiting_key("w"), "1", px=5000)
    assert leases.revoke("w", gone.fence)
    assert redis_client.lrange(wake_key("w"), 0, -1) == [b"1"]
