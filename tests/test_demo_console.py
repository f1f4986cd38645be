"""`python -m devtools demo --console` (`make demo DEMO_ARGS="--console"`): the demo also serves
the operator console, prints its URL and the run's credentials once, keeps it up after the
verification and stops it on Ctrl-C."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

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
                 "--partition-size", "1000", "--console", "--console-port", str(port)],
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
