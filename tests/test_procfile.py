"""The Procfile and docker-compose.yml start the platform with the commands a user types.

Docker cannot run here, so the Procfile is started for real (with honcho) and every command the
compose file names is checked to be one of the same real entry points (`celery -A tasks ...`
or `python -m tasks console`).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from celery import Celery

from tests.support.redis_server import RedisServer, free_port
from tests.support.workers import ROOT, Proc, celery_call, platform_env

BIN = Path(sys.executable).parent
# (program, subcommand): Celery's worker, beat and Flower, and the operator console.
ENTRY_POINTS = {("celery", "worker"), ("celery", "beat"), ("celery", "flower"),
                ("python", "console")}
# Process names: two kinds of worker (partitions apart from controls and restock, issue 11).
PROCESSES = {"worker", "control", "beat", "flower", "console"}


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line.strip())


def entry_argv(line: str) -> list[str]:
    """The `celery -A tasks ...` or `python -m tasks ...` command inside a Procfile line (which
    may wrap it in a loop or set a variable first)."""
    found = re.search(r"(celery -A|python -m) tasks [^;]*", line)
    assert found, line
    return shlex.split(found.group(0))


def compose_commands() -> dict[str, list[str]]:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return {name: svc["command"] for name, svc in spec["services"].items()
            if "command" in svc and name not in ("redis", "postgres")}


def test_every_command_is_a_real_entry_point_of_this_project() -> None:
    commands = [entry_argv(cmd) for cmd in procfile().values()]
    commands += list(compose_commands().values())
    assert {(argv[0], argv[3]) for argv in commands} == ENTRY_POINTS
    for argv in commands:
        assert argv[1:3] in (["-A", "tasks"], ["-m", "tasks"]), argv
        assert shutil.which(argv[0], path=str(BIN)), f"{argv[0]} is not in this venv"
        shown = subprocess.run([str(BIN / argv[0]), *argv[1:4], "--help"], cwd=ROOT,
                               env=platform_env(), capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
    assert set(compose_commands()) == set(procfile()) == PROCESSES


def _get(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _get(url)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.mark.timeout(180)
def test_the_procfile_starts_worker_beat_flower_and_the_console_with_auth(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    # Imported here: both modules import this one's HTTP helpers.
    from tests.test_console_http import Browserless
    from tests.test_flower import listening_addresses

    port, console_port = free_port(), free_port()
    env = platform_env(
        REDIS_URL=private_redis.url, DATABASE_URL=f"sqlite:///{tmp_path}/p.sqlite",
        FLOWER_BASIC_AUTH="admin:s3cret-pw", FLOWER_PORT=str(port), WORKER_CONCURRENCY="1",
        CONSOLE_USER="operator", CONSOLE_PASSWORD="console-pw-7077",
        CONSOLE_PORT=str(console_port), PATH=f"{BIN}:{platform_env()['PATH']}", LEASE_TTL="2",
    )
    for name in ("CONSOLE_ADDRESS", "CONSOLE_SECRET", "FLOWER_URL"):
        env.pop(name, None)
    honcho = Proc([str(BIN / "honcho"), "-f", str(ROOT / "Procfile"), "start"], env, "honcho")
    try:
        honcho.wait_for("ready.", timeout=90)
        honcho.wait_for("became leader", timeout=60)
        _wait_http(f"http://127.0.0.1:{port}/")
        assert _get(f"http://127.0.0.1:{port}/workers") == 401
        assert _get(f"http://127.0.0.1:{port}/workers", "admin:wrong") == 401
        assert _get(f"http://127.0.0.1:{port}/workers", "admin:s3cret-pw") == 200
        # The console: on loopback only, its login page answers, the rest needs a session,
        # the credentials of the environment log in, and it links the Procfile's Flower.
        console = f"http://127.0.0.1:{console_port}"
        _wait_http(f"{console}/login")
        assert listening_addresses(console_port) == {"127.0.0.1"}
        assert _get(f"{console}/login") == 200
        assert _get(f"{console}/api/jobs") == 401
        operator = Browserless(console)
        assert operator.login("operator", "wrong").status == 401
        assert operator.login("operator", "console-pw-7077").status == 302
        jobs = operator.request("/jobs")
        assert jobs.status == 200 and f'href="http://127.0.0.1:{port}"' in jobs.body
        sent = celery_call(env, "tasks.health.ping")
        assert sent.returncode == 0, sent.stderr
        client = Celery(broker=private_redis.url, backend=private_redis.url, set_as_current=False)
        report = client.AsyncResult(sent.stdout.strip().splitlines()[-1]).get(timeout=60)
        client.close()
        assert report["status"] == "ok"
        assert "s3cret-pw" not in honcho.output()
        assert "console-pw-7077" not in honcho.output()
    finally:
        honcho.stop()


def test_flower_refuses_to_start_without_credentials(private_redis: RedisServer) -> None:
    env = platform_env(REDIS_URL=private_redis.url, FLOWER_PORT=str(free_port()))
    env.pop("FLOWER_BASIC_AUTH", None)
    proc = subprocess.run([str(BIN / "celery"), "-A", "tasks", "flower"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "FLOWER_BASIC_AUTH" in proc.stdout + proc.stderr


def test_compose_restarts_every_platform_service() -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name in ("worker", "control", "beat", "flower", "console", "prometheus", "redis",
                 "postgres"):
        assert spec["services"][name].get("restart") == "unless-stopped", name


def test_compose_serves_the_console_with_credentials_from_the_environment() -> None:
    """Like Flower: the console binds every address inside its container, its port is
    published on the host's loopback only, and compose refuses to start without credentials."""
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    console = spec["services"]["console"]
    env = console["environment"]
    assert env["CONSOLE_ADDRESS"] == "0.0.0.0"
    for name in ("CONSOLE_USER", "CONSOLE_PASSWORD"):
        assert re.fullmatch(rf"\$\{{{name}:\?[^}}]+\}}", env[name]), env[name]
    assert env["DATABASE_URL"] == spec["x-platform"]["environment"]["DATABASE_URL"]
    assert console["ports"] == [f"127.0.0.1:{env['CONSOLE_PORT']}:{env['CONSOLE_PORT']}"]
    assert f":{env['CONSOLE_PORT']}/login" in console["healthcheck"]["test"][-1]
    assert spec["services"]["flower"]["ports"] == ["127.0.0.1:5555:5555"]


def test_compose_prometheus_scrapes_every_worker_and_beat_on_their_metrics_port() -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    prometheus = services["prometheus"]
    config_path = "./deploy/prometheus/prometheus.yml"
    assert f"{config_path}:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    config = yaml.safe_load((ROOT / config_path).read_text())
    (job,) = config["scrape_configs"]
    (discovery,) = job["dns_sd_configs"]
    for name in ("worker", "control", "beat"):
        env = services[name].get("environment", spec["x-platform"]["environment"])
        assert env["METRICS_ADDRESS"] == "0.0.0.0", name
        assert int(env["METRICS_PORT"]) == discovery["port"], name
    assert set(discovery["names"]) == {"worker", "control", "beat"}
    assert discovery["type"] == "A"  # every replica of a service, not one of them


def test_compose_checks_the_health_of_every_service_and_persists_stock() -> None:
    """Issue 13: Redis keeps stock on an append-only file on a volume; every service has a
    health check, the worker's reading its heartbeat file (never a queued task)."""
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
    redis_argv = services["redis"]["command"]
    assert redis_argv[redis_argv.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    assert "rabbitmq-diagnostics" in services["rabbitmq"]["healthcheck"]["test"]
    worker_check = services["worker"]["healthcheck"]["test"]
    assert worker_check[0] == "CMD-SHELL" and "$$WORKER_HEARTBEAT_FILE" in worker_check[1]
    assert services["worker"]["environment"]["WORKER_HEARTBEAT_FILE"]
    assert spec["x-platform"]["depends_on"]["redis"]["condition"] == "service_healthy"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.timeout(150)
def test_the_procfile_worker_comes_back_after_it_dies_and_stops_on_sigterm(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    """Honcho stops every process when one exits, so the Procfile's worker line restarts a
    worker that died; SIGTERM to its process group (what honcho sends) still stops it."""
    env = platform_env(REDIS_URL=private_redis.url, DATABASE_URL=f"sqlite:///{tmp_path}/p.db",
                       WORKER_CONCURRENCY="1", PATH=f"{BIN}:{platform_env()['PATH']}")
    line = procfile()["worker"]
    shell = Proc(["sh", "-c", line], env, "procfile-worker")
    try:
        shell.wait_for("ready.", timeout=90)
        (first,) = _children(shell.pid)
        os.kill(first, signal.SIGKILL)
        shell.wait_for("restarting in 2 s", timeout=30)
        deadline = time.monotonic() + 90
        while shell.output().count("ready.") < 2:
            assert shell.popen.poll() is None, shell.output()[-3000:]
            assert time.monotonic() < deadline, shell.output()[-3000:]
            time.sleep(0.3)
        assert _children(shell.pid) and _children(shell.pid) != [first]
        shell.signal(signal.SIGTERM, group=True)
        assert shell.popen.wait(60) == 0
        assert "Warm shutdown" in shell.output()
    finally:
        shell.stop()


def test_the_platform_loads_the_example_job_as_a_user_loads_theirs() -> None:
    """The example job is a user's project (examples/): the Procfile's and compose's platform
    processes name it in EXTRA_TASK_MODULES unless the operator set that variable (set and
    empty: none), and the image carries the folder it is imported from."""
    default = "${EXTRA_TASK_MODULES-examples.cm_data}"
    for name, line in procfile().items():
        if name != "flower":
            assert f"EXTRA_TASK_MODULES={default} " in line, name
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert spec["x-platform"]["environment"]["EXTRA_TASK_MODULES"] == default
    dockerfile = (ROOT / "Dockerfile").read_text().splitlines()
    assert "COPY examples examples" in dockerfile
