"""The Procfile and docker-compose.yml start the platform with the commands a user types.

Docker cannot run here, so the Procfile is started for real (with honcho) and every command the
compose file names is checked to be one of the same real entry points (`celery -A tasks ...`
or `python -m tasks console`).
"""

from __future__ import annotations

import base64
import json
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
from typing import Any

import pytest
import yaml
from celery import Celery

from tests.support.redis_server import RedisServer, free_port
from tests.support.workers import ROOT, Proc, celery_call, platform_env

BIN = Path(sys.executable).parent
# (program, subcommand): Celery's worker, beat and Flower, and the operator console.
ENTRY_POINTS = {("celery", "worker"), ("celery", "beat"), ("celery", "flower"),
                ("python", "console"), ("python", "migrate")}
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


@pytest.mark.timeout(300)  # a real interpreter per command: slow on a busy machine
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
    assert set(procfile()) == PROCESSES
    assert set(compose_commands()) == PROCESSES | {"migrate"}


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

    port, console_port, metrics = free_port(), free_port(), metrics_ports()
    env = platform_env(
        REDIS_URL=private_redis.url, DATABASE_URL=f"sqlite:///{tmp_path}/p.sqlite",
        FLOWER_BASIC_AUTH="admin:s3cret-pw", FLOWER_PORT=str(port), WORKER_CONCURRENCY="1",
        CONSOLE_USER="operator", CONSOLE_PASSWORD="console-pw-7077",
        CONSOLE_PORT=str(console_port), PATH=f"{BIN}:{platform_env()['PATH']}", LEASE_TTL="2",
        METRICS_PORT=str(metrics),
    )
    for name in ("CONSOLE_ADDRESS", "CONSOLE_SECRET", "FLOWER_URL"):
        env.pop(name, None)
    # `-e`: this test's environment only, whatever .env a developer keeps in the checkout.
    honcho = Proc([str(BIN / "honcho"), "-f", str(ROOT / "Procfile"), "-e", os.devnull, "start"],
                  env, "honcho")
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
        # One METRICS_PORT in .env: worker, control worker and beat each on their own port
        for offset, role in ((0, "worker"), (10, "worker"), (20, "beat")):
            honcho.wait_for(f"metrics on http://127.0.0.1:{metrics + offset}/metrics ({role})")
        _wait_http(f"http://127.0.0.1:{metrics + 20}/metrics")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics + 20}/metrics") as reply:
            assert b"rangekeeper_state_collect_seconds" in reply.read()  # the leader's state
    finally:
        honcho.stop()


def metrics_ports() -> int:
    """A free port whose +10 and +20 are free too (the Procfile's control worker and beat)."""
    import socket

    while True:
        base = free_port()
        try:
            for offset in (10, 20):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base


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
        if name != "migrate":  # a one-shot: the others wait for it to complete
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


# -- the migrate step, Grafana and .env (issue 22) -------------------------------------------


def compose_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return spec


def test_compose_migrates_once_before_every_platform_service_starts() -> None:
    services = compose_spec()["services"]
    migrate = services["migrate"]
    assert migrate["command"] == ["python", "-m", "tasks", "migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert migrate["environment"]["DATABASE_URL"] == \
        compose_spec()["x-platform"]["environment"]["DATABASE_URL"]
    for name in PROCESSES:
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"}, name
        assert services[name]["image"] == migrate["image"], name


def test_compose_runs_the_platform_on_a_read_only_root_without_capabilities() -> None:
    """The same confinement as deploy/k8s/ (tests/test_deploy.py runs every pod's command so):
    /tmp is the only writable place, and it holds the worker's heartbeat."""
    services = compose_spec()["services"]
    for name in PROCESSES | {"migrate"}:
        service = services[name]
        assert service["read_only"] is True and service["tmpfs"] == ["/tmp"], name
        assert service["cap_drop"] == ["ALL"], name
        assert service["security_opt"] == ["no-new-privileges:true"], name
    heartbeat = services["worker"]["environment"]["WORKER_HEARTBEAT_FILE"]
    assert Path(heartbeat).is_relative_to("/tmp")


def test_compose_provisions_grafana_with_the_dashboard_behind_a_profile() -> None:
    services = compose_spec()["services"]
    grafana = services["grafana"]
    assert grafana["profiles"] == ["grafana"]
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]
    assert grafana["environment"]["GF_AUTH_DISABLE_LOGIN_FORM"] == "true"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    mounts = {host: inside.removesuffix(":ro") for host, inside in
              (v.split(":", 1) for v in grafana["volumes"]) if host.startswith("./")}
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboard_path = Path(mounts["./deploy/grafana/rangekeeper.json"])
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "rangekeeper.yml").read_text())[
        "providers"]
    assert Path(provider["options"]["path"]) == dashboard_path.parent
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == \
        str(dashboard_path)
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"]
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "rangekeeper.json").read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert source["type"] == variable["query"] == "prometheus" and source["isDefault"]
    prometheus_port = services["prometheus"]["ports"][0].rsplit(":", 1)[1]
    assert source["url"] == f"http://prometheus:{prometheus_port}"
    assert "prometheus" in grafana["depends_on"]


# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}: compose's forms.
_INTERPOLATION = re.compile(r"\$\{(\w+)(?:(:?)([-?])([^}]*))?\}")


def _interpolate(value: str, env: dict[str, str]) -> str:
    def one(found: re.Match[str]) -> str:
        name, colon, kind, word = found.groups()
        unset = name not in env or (colon == ":" and env[name] == "")
        if kind == "?" and unset:
            raise ValueError(f"{name}: {word}")
        return word if kind == "-" and unset else env.get(name, "")
    return _INTERPOLATION.sub(one, value)


def _container_env(service: dict[str, Any], dotenv: dict[str, str]) -> dict[str, str]:
    """What compose gives a container: its env_file (here `dotenv`), then its `environment`,
    both interpolated from `dotenv` (compose reads .env for ${...})."""
    env = dict(dotenv) if service.get("env_file") else {}
    env.update({k: _interpolate(str(v), dotenv) for k, v in service["environment"].items()})
    return env


def example_env() -> dict[str, str]:
    from honcho.environ import parse

    found: dict[str, str] = parse((ROOT / ".env.example").read_text())
    return found


CREDENTIALS = {"CONSOLE_USER", "CONSOLE_PASSWORD", "CONSOLE_SECRET", "FLOWER_BASIC_AUTH"}


def test_the_env_example_holds_known_settings_and_no_credential() -> None:
    """One file for honcho and compose: every variable is one the platform (or the Procfile)
    reads, its values pass the settings' checks, and the credentials are left to the user."""
    from tasks.wings import load_settings, variables

    text = (ROOT / ".env.example").read_text()
    env = example_env()
    procfile_variables = set(re.findall(r"\$\{(\w+)", " ".join(procfile().values())))
    known = variables() | procfile_variables | {"FLOWER_BASIC_AUTH"}
    assert set(env) <= known, set(env) - known
    for name in CREDENTIALS:
        assert re.search(rf"^{name}=$", text, re.M), f"{name}: not an empty line to fill"
        assert name not in env  # empty: unset for honcho, as for the settings
    load_settings(env)
    assert "cp .env.example .env" in text
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()
    assert compose_spec()["x-platform"]["env_file"] == [{"path": ".env", "required": False}]


def test_compose_gives_each_container_only_its_credentials() -> None:
    """With every credential filled in .env, the console gets the console's and Flower
    Flower's; no other container gets one. Left empty, compose refuses with a message naming
    .env (the ${VAR:?...} of the console and Flower)."""
    filled = dict(example_env(), CONSOLE_USER="operator", CONSOLE_PASSWORD="pw-0123456789ab",
                  CONSOLE_SECRET="s" * 40, FLOWER_BASIC_AUTH="admin:fw-0123456789")
    services = compose_spec()["services"]
    needs = {"console": {"CONSOLE_USER", "CONSOLE_PASSWORD", "CONSOLE_SECRET"},
             "flower": {"FLOWER_BASIC_AUTH"}}
    for name in PROCESSES | {"migrate"}:
        env = _container_env(services[name], filled)
        given = {k for k in CREDENTIALS - {"CONSOLE_USER"} if env.get(k)}
        assert given == needs.get(name, set()) - {"CONSOLE_USER"}, (name, given)
    assert _container_env(services["console"], filled)["CONSOLE_PASSWORD"] == "pw-0123456789ab"
    for name in ("console", "flower"):
        with pytest.raises(ValueError, match=r"\.env"):
            _container_env(services[name], example_env())


@pytest.mark.timeout(60)
def test_honcho_with_the_example_env_keeps_running_without_console_and_flower_credentials(
    tmp_path: Path
) -> None:
    """Issue 22: `honcho start` stopped within 2 s when the console's or Flower's credentials
    were missing (honcho stops everything when one process exits). With the .env copied from
    .env.example, the two say what to set and wait; the rest runs; a stop still stops them."""
    dotenv = tmp_path / ".env"
    dotenv.write_text((ROOT / ".env.example").read_text())
    env = platform_env(PATH=f"{BIN}:{platform_env()['PATH']}")
    for name in CREDENTIALS:
        env.pop(name, None)
    honcho = Proc([str(BIN / "honcho"), "-f", str(ROOT / "Procfile"), "-e", str(dotenv),
                   "start", "flower", "console"], env, "honcho-example")
    try:
        honcho.wait_for("Flower not started: set FLOWER_BASIC_AUTH", timeout=20)
        honcho.wait_for("console not started: set CONSOLE_USER and CONSOLE_PASSWORD",
                        timeout=20)
        time.sleep(2.5)
        assert honcho.popen.poll() is None, honcho.output()
        honcho.signal(signal.SIGTERM)
        honcho.popen.wait(10)  # honcho's own code is 143 (SIGTERM); its processes end cleanly
        for name in ("flower", "console"):
            assert f"{name}.1 stopped (rc=0)" in honcho.output(), honcho.output()
    finally:
        honcho.stop()
