"""Many threads and processes contend for one lease: one holder at a time, fences in order."""

from __future__ import annotations

import json

import pytest
import redis

from lease import Leases
from tests.lease.conftest import holder_process
from tests.lease.holder import contend


def _check(records: list[tuple[float, int, int]], expected: int) -> None:
    assert len(records) == expected
    assert {inside for _, _, inside in records} == {1}  # never two holders inside
    fences = [fence for _, fence, _ in sorted(records)]
    assert len(set(fences)) == expected
    assert fences == sorted(fences)  # ordered by time of holding == ordered by fence


def test_threads_take_turns(
    redis_url: str, leases: Leases, capsys: pytest.CaptureFixture[str]
) -> None:
    contend(redis_url, "race:threads", 30, 8)
    records = json.loads(capsys.readouterr().out)["records"]
    _check([tuple(r) for r in records], 240)
    assert leases.current_fence("race:threads") == 240


def test_processes_take_turns(redis_url: str, redis_client: redis.Redis) -> None:
    procs = [holder_process("contend", redis_url, "race:procs", "20", "2") for _ in range(4)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=60)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert [proc.returncode for proc in procs] == [0] * 4
    records = [tuple(r) for out in outputs for r in json.loads(out)["records"]]
    _check(records, 160)
    assert redis_client.get("inside:race:procs") == b"0"
