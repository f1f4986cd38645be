"""The shortcuts of the acquire/renew/release hot paths agree with the slow, obvious code."""

from __future__ import annotations

import os
import string

import pytest
import redis

from lease import Leases
from lease import lease as lease_module
from lease import leases as leases_module
from lease.keys import fence_key, lease_key, waiting_key, wake_key
from lease.scripts import TOKEN_CHARS


@pytest.mark.parametrize("name", ["plain", "range:cm_data:3", "{node:3}:q1", "{tag}"])
def test_hot_path_keys_are_the_keys_module_keys(
    leases: Leases, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    seen: list[list[str | bytes]] = []
    real = leases._scripts.run

    def spy(script: object, keys: list[str | bytes], args: object) -> object:
        seen.append([k.decode() if isinstance(k, bytes) else k for k in keys])
        return real(script, keys, args)  # type: ignore[arg-type]

    monkeypatch.setattr(leases._scripts, "run", spy)
    lease = leases.acquire(name, ttl=5.0, renew=False)
    lease.renew()
    lease.release()
    assert seen == [
        [lease_key(name), fence_key(name)],
        [lease_key(name)],
        [lease_key(name), waiting_key(name), wake_key(name)],
    ]


def test_tokens_are_fresh_hex_and_never_repeat() -> None:
    tokens = [leases_module._new_token() for _ in range(1000)]  # spans many pool refills
    assert len(set(tokens)) == len(tokens)
    assert all(len(t) == TOKEN_CHARS and set(t) <= set(string.hexdigits) for t in tokens)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads (3.12+)
def test_a_forked_child_draws_other_tokens_and_knows_its_pid() -> None:
    leases_module._new_token()  # the pool now holds tokens the parent will hand out
    parents_next = list(leases_module._tokens)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            ok = lease_module._pid == os.getpid() and leases_module._new_token() not in parents_next
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1" and os.waitstatus_to_exitcode(status) == 0
    os.close(read)
    assert lease_module._pid == os.getpid()


def test_the_ttl_argument_follows_each_acquire(
    leases: Leases, redis_client: redis.Redis
) -> None:
    first = leases.acquire("ttl:a", ttl=2.0)
    second = leases.acquire("ttl:b", ttl=5.0)
    third = leases.acquire("ttl:c", ttl=2.0, max_lifetime=1.0)
    assert 1500 < redis_client.pttl(first._key) <= 2000
    assert 4500 < redis_client.pttl(second._key) <= 5000
    assert 500 < redis_client.pttl(third._key) <= 1000
    second.renew()
    assert redis_client.pttl(second._key) > 4500
    for lease in (first, second, third):
        lease.release()
