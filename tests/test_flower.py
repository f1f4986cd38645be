"""Flower fails closed from any working directory (issue 9 item 14): started outside the
checkout (so flowerconfig.py is not read), it still refuses to run without auth, and with auth
it listens on 127.0.0.1 only and answers 401 to a request without credentials."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer, free_port
from tests.support.workers import platform_env
from tests.test_procfile import _get, _wait_http

CELERY = [sys.executable, "-m", "celery", "-A", "tasks", "flower"]


def listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses with a listening TCP socket on `port` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            octets = bytes.fromhex(address)[::-1]
            found.add(".".join(str(b) for b in octets))
    return found


def test_flower_without_auth_refuses_to_start_outside_the_checkout(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    env = platform_env(REDIS_URL=private_redis.url, FLOWER_PORT=str(free_port()))
    env.pop("FLOWER_BASIC_AUTH", None)
    proc = subprocess.Popen(CELERY, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"Flower kept running without auth:\n{out[-2000:]}")
    assert proc.returncode != 0
    assert "FLOWER_BASIC_AUTH must be set" in out


@pytest.mark.timeout(120)
def test_flower_with_auth_outside_the_checkout_binds_loopback_and_asks_for_credentials(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    port = free_port()
    env = platform_env(REDIS_URL=private_redis.url, FLOWER_PORT=str(port),
                       FLOWER_BASIC_AUTH="admin:s3cret-pw")
    env.pop("FLOWER_ADDRESS", None)
    log = (tmp_path / "flower.log").open("wb")
    proc = subprocess.Popen(CELERY, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/")
        assert listening_addresses(port) == {"127.0.0.1"}
        assert _get(f"http://127.0.0.1:{port}/workers") == 401
        assert _get(f"http://127.0.0.1:{port}/tasks") == 401
        assert _get(f"http://127.0.0.1:{port}/workers", "admin:s3cret-pw") == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
