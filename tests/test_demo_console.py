"""`python -m devtools demo --console` (`make demo DEMO_ARGS="--console"`): the demo also serves
the operator console, prints its URL and the run's credentials once, runs its job slowly
enough to try every control (a pause through the console lands mid-run), keeps the console up
after the verification and stops it on Ctrl-C."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.redis_server import RedisServer, free_port
from tests.support.workers import ROOT, Proc, platform_env, wait_until
from tests.test_console_http import Browserless
from tests.test_flower import listening_addresses


@pytest.mark.timeout(180)
def test_the_demo_serves_the_console_with_credentials_printed_once_until_ctrl_c(
    private_redis: RedisServer,
) -> None:
    port = free_port()
    env = platform_env(REDIS_URL=private_redis.url, COLUMNS="200")
    for name in ("CONSOLE_USER", "CONSOLE_PASSWORD", "CONSOLE_ADDRESS", "CONSOLE_PORT"):
        env.pop(name, None)
    demo = Proc([sys.executable, "-m", "devtools", "demo", "--rows", "2000",
                 "--partition-size", "1000", "--console", "--console-port", str(port),
                 "--throttle", "0"],  # full speed: this test is about the end of the run
                env, "demo")
    logs: Path | None = None
    try:
        demo.wait_for("press Ctrl-C to stop the demo", timeout=150)
        out = demo.output()
        assert "exactly once: yes" in out
        found = re.search(r"console: (\S+)   user: (\S+)   password: (\S+)", out)
        assert found, out
        url, user, password = found.groups()
        assert url == f"http://127.0.0.1:{port}/" and user == "admin"
        assert out.count(password) == 1  # printed once, and in nothing else it printed
        logs = Path(re.search(r"logs: (\S+)", out).group(1))  # type: ignore[union-attr]
        assert listening_addresses(port) == {"127.0.0.1"}
        operator = Browserless(url.rstrip("/"))
        assert operator.request("/login").status == 200
        assert operator.request("/api/jobs").status == 401
        assert operator.login(user, "not-" + password).status == 401
        assert operator.login(user, password).status == 302
        jobs = operator.request("/api/jobs").json()["data"]
        assert "cm_data" in str(jobs), jobs  # the demo's job, on the demo's stores
        log_text = "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
        assert "console: serving" in log_text and password not in log_text
        demo.signal(signal.SIGINT)  # the terminal's Ctrl-C
        assert demo.popen.wait(60) == 0, demo.output()[-3000:]
        wait_until(lambda: not listening_addresses(port), 10, "the console to stop")
    finally:
        demo.stop()
        if logs is not None:
            shutil.rmtree(logs, ignore_errors=True)


def test_the_demo_refuses_a_console_port_that_is_not_a_tcp_port() -> None:
    bad = subprocess.run([sys.executable, "-m", "devtools", "demo", "--console-port", "0"],
                         cwd=ROOT, env=platform_env(), capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--console-port must be a TCP port" in bad.stderr


def _job(operator: Browserless) -> dict[str, Any]:
    answer = operator.request("/api/jobs/cm_data")
    assert answer.status == 200, answer.body
    found: dict[str, Any] = answer.json()["data"]
    return found


@pytest.mark.timeout(240)
def test_the_console_demo_s_job_runs_for_minutes_and_a_pause_from_the_console_lands(
    private_redis: RedisServer,
) -> None:
    """At its defaults the console demo throttles its run to last about 150 s (here 150,000
    rows at 1,000 rows/s over 10 partitions): 20 s in, it is still running, and a pause
    posted to the console API stops every partition; then Ctrl-C stops the demo mid-run."""
    port = free_port()
    env = platform_env(REDIS_URL=private_redis.url, COLUMNS="200")
    for name in ("CONSOLE_USER", "CONSOLE_PASSWORD", "CONSOLE_ADDRESS", "CONSOLE_PORT"):
        env.pop(name, None)
    demo = Proc([sys.executable, "-m", "devtools", "demo", "--rows", "150000",
                 "--partition-size", "15000", "--console", "--console-port", str(port)],
                env, "demo")
    logs: Path | None = None
    try:
        demo.wait_for("the run started with `python -m tasks jobs start cm_data`", timeout=150)
        began = time.monotonic()  # the workers are up: the run's batches begin
        out = demo.output()
        assert "slow motion: the run is throttled to 1,000 rows/s" in out
        logs = Path(re.search(r"logs: (\S+)", out).group(1))  # type: ignore[union-attr]
        found = re.search(r"console: (\S+)   user: (\S+)   password: (\S+)", out)
        assert found, out
        url, user, password = found.groups()
        operator = Browserless(url.rstrip("/"))
        assert operator.login(user, password).status == 302
        time.sleep(max(0.0, 20 - (time.monotonic() - began)))
        job = _job(operator)
        assert job["runs"][0]["state"] == "running", job["runs"][0]
        parts = job["partitions"]
        assert len(parts) == 10 and not all(p["status"] == "done" for p in parts), parts
        assert "exactly once" not in demo.output()  # the demo is still watching its run
        token = operator.csrf()
        paused = operator.request("/api/jobs/cm_data/pause", {}, {"X-CSRF-Token": token})
        assert paused.status == 200, paused.body
        wait_until(lambda: _job(operator)["runs"][0]["state"] == "paused", 15, "a paused run")
        wait_until(lambda: not any(p["status"] == "running" for p in _job(operator)["partitions"]),
                   30, "every partition stopped at its batch boundary")
        rows = sum(p.get("rows_done", 0) for p in _job(operator)["partitions"])
        assert 0 < rows < 150_000, rows
        demo.signal(signal.SIGINT)  # the terminal's Ctrl-C, mid-run
        assert demo.popen.wait(60) == 130, demo.output()[-3000:]
        assert "interrupted: stopping" in demo.output()
        wait_until(lambda: not listening_addresses(port), 10, "the console to stop")
    finally:
        demo.stop()
        if logs is not None:
            shutil.rmtree(logs, ignore_errors=True)
