"""A forked child (a Celery prefork worker) inherits no leases and runs its own keeper."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable

import pytest
import redis

from lease import Keeper, Leases, NotHeld
from tests.lease.conftest import heartbeating, wait_until


def _child(quiet: Leases, live: Leases, inherited: list) -> None:
    """Runs in the child; raises on any failure."""
    assert quiet.keeper.held() == [] and live.keeper.held() == []
    assert live.keeper._workers == []  # the parent's threads do not exist here
    for lease in inherited:
        for method in (lease.heartbeat, lease.check, lease.renew, lease.release):
            with pytest.raises(NotHeld):
                method()
    # The child's own lease gets a keeper thread of its own, which renews it.
    own = live.acquire("fork:child", ttl=0.3)
    with heartbeating(own):
        deadline = time.monotonic() + 0.9  # past the parent's TTL (0.5 s)
        while time.monotonic() < deadline:
            assert quiet.keeper.tick() == 0  # nothing inherited to renew
            time.sleep(0.05)
        assert not own.lost
    assert live.stats()["renewed"] >= 2
    own.release()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_child_does_not_renew_the_parents_leases(
    redis_client: redis.Redis, make_leases: Callable[..., Leases]
) -> None:
    # `quiet` never renews in the parent (no threads): only a child that wrongly kept its
    # state could renew its lease. `live` has running threads at fork time.
    quiet = make_leases(redis_client, keeper=Keeper(redis_client, threads=False))
    live = make_leases(redis_client)
    parents = quiet.acquire("fork:parent", ttl=0.5)
    parents.heartbeat()  # progress: a keeper that still tracked it would renew it
    busy = live.acquire("fork:busy", ttl=5.0)
    busy.heartbeat()

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 0
        try:
            _child(quiet, live, [parents, busy])
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)

    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The child ran ~0.9 s ticking a keeper; the parent's 0.5 s lease lapsed all the same.
    assert wait_until(lambda: not redis_client.exists(parents._key), 0.5)
    assert redis_client.get(busy._key) == busy.token.encode()  # the child did not release it
    assert [lease.name for lease in live.keeper.held()] == ["fork:busy"]
    busy.release()
