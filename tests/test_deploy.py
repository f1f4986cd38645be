"""The Kubernetes manifests (deploy/k8s/) name real entry points, and their probes work.

No cluster runs here: every manifest is parsed; every command and probe is checked to be one
of this project's entry points (the Celery app `tasks`, the `python -m tasks` verbs); the
heartbeat path, the preStop wait and the termination grace period are checked against the
settings; and the worker's liveness probe and preStop hook are run, as written, against real
prefork workers.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tasks.app import HANDOVER_SECONDS, soft_shutdown_timeout
from tasks.cli import cli
from tasks.settings import _FIELDS, load_settings
from tests.support.brokers import platform_client
from tests.support.db import fresh_database
from tests.support.workers import ROOT, start_worker, wait_until

K8S = ROOT / "deploy" / "k8s"
CELERY_SUBCOMMANDS = {"worker", "beat", "flower", "inspect"}
# Variables read by something other than tasks.settings (Flower, through flowerconfig.py).
OTHER_VARIABLES = {"FLOWER_BASIC_AUTH", "FLOWER_ADDRESS", "FLOWER_PORT"}


def documents() -> list[dict[str, Any]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == kind}


def containers() -> dict[str, dict[str, Any]]:
    return {c["name"]: c for d in by_kind("Deployment").values()
            for c in d["spec"]["template"]["spec"]["containers"]}


def manifest_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for config in by_kind("ConfigMap").values():
        env.update(config["data"])
    for secret in by_kind("Secret").values():
        env.update(secret["stringData"])
    return env


def probe_argv(probe: dict[str, Any]) -> list[str]:
    """The command a probe or hook runs; a `sh -c SCRIPT` gives the script's words."""
    argv: list[str] = probe["exec"]["command"]
    if argv[:2] == ["sh", "-c"]:
        return shlex.split(argv[2])
    return argv


def check_entry_point(argv: list[str]) -> None:
    """`celery -A tasks SUBCOMMAND ...` or `python -m tasks VERB ...` with a verb that exists."""
    if argv[0] == "celery":
        assert argv[:3] == ["celery", "-A", "tasks"], argv
        assert argv[3] in CELERY_SUBCOMMANDS, argv
    else:
        assert argv[:3] == ["python", "-m", "tasks"], argv
        shown = CliRunner().invoke(cli, [*argv[3:], "--help"])
        assert shown.exit_code == 0, f"{argv}: {shown.output}"
        for option in (a for a in argv[3:] if a.startswith("--")):
            assert option in shown.output, f"{argv}: no {option}"


def test_every_manifest_parses_and_runs_a_real_entry_point() -> None:
    deployments = by_kind("Deployment")
    assert {d["spec"]["template"]["metadata"]["labels"]["component"]
            for d in deployments.values()} == {"worker", "control", "beat", "flower", "console"}
    assert deployments["rangekeeper-beat"]["spec"]["replicas"] == 2
    configs, secrets = set(by_kind("ConfigMap")), set(by_kind("Secret"))
    for name, container in containers().items():
        check_entry_point(container["command"])
        for source in container["envFrom"]:
            ref = source.get("configMapRef") or source["secretRef"]
            assert ref["name"] in (configs | secrets), f"{name}: {ref}"
        for probe in ("livenessProbe", "readinessProbe"):
            assert probe in container, f"{name} has no {probe}"
            if "exec" in container[probe]:
                argv = probe_argv(container[probe])
                if argv[0] in ("celery", "python"):
                    check_entry_point(argv)
        assert "preStop" in container["lifecycle"], name


def test_the_settings_in_the_configmap_and_secret_are_valid_and_known() -> None:
    env = manifest_env()
    known = {variable for variable, _ in _FIELDS.values()} | OTHER_VARIABLES
    assert set(env) <= known, f"unknown variables: {set(env) - known}"
    load_settings(env)  # raises SettingsError, naming the variable, on a bad value


@pytest.mark.parametrize("name", ["worker", "control"])
def test_the_worker_probes_address_the_worker_and_its_heartbeat(name: str) -> None:
    worker = containers()[name]
    hostname = next(a for a in worker["command"] if a.startswith("--hostname="))
    assert hostname == f"--hostname={name}@%h"  # %h: the pod name, $HOSTNAME in its shell
    ping = probe_argv(worker["readinessProbe"])
    assert ping[3:6] == ["inspect", "ping", "-d"] and ping[6] == f"{name}@$HOSTNAME"
    heartbeat = Path(manifest_env()["WORKER_HEARTBEAT_FILE"])
    mounts = {Path(m["mountPath"]) for m in worker["volumeMounts"]}
    assert heartbeat.parent in mounts, "the heartbeat file must be on a mounted volume"
    for probe in ("startupProbe", "livenessProbe"):
        assert "$WORKER_HEARTBEAT_FILE" in worker[probe]["exec"]["command"][2]
    interval = load_settings(manifest_env()).worker_heartbeat_interval
    assert _probe_age(worker) >= 3 * interval


def _probe_age(container: dict[str, Any]) -> int:
    script = container["livenessProbe"]["exec"]["command"][2]
    found = re.search(r"-newermt '-(\d+) seconds'", script)
    assert found
    return int(found.group(1))


@pytest.mark.parametrize("name", ["rangekeeper-worker", "rangekeeper-control"])
def test_the_grace_period_covers_one_batch_the_soft_shutdown_and_the_handover(name: str) -> None:
    settings = load_settings(manifest_env())
    soft = soft_shutdown_timeout(settings)  # one batch (<= LEASE_TTL) + the handover
    spec = by_kind("Deployment")[name]["spec"]["template"]["spec"]
    script = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2]
    waited = re.search(r"\$i -lt (\d+)", script)
    assert waited and int(waited.group(1)) == soft, "preStop waits one batch + the handover"
    assert spec["terminationGracePeriodSeconds"] >= 2 * soft + HANDOVER_SECONDS


def _liveness(container: dict[str, Any], env: dict[str, str]) -> int:
    return subprocess.run(container["livenessProbe"]["exec"]["command"], env=env,
                          capture_output=True, timeout=30).returncode


@pytest.mark.timeout(120)
def test_the_liveness_probe_passes_while_the_worker_is_busy_and_fails_when_it_hangs(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    alive = tmp_path / "run" / "worker-alive"
    env = dict(worker_env, WORKER_HEARTBEAT_FILE=str(alive), WORKER_HEARTBEAT_INTERVAL="0.5")
    probe = containers()["worker"]
    fresh_database(env["DATABASE_URL"]).dispose()
    worker = start_worker(env, 1, "hb")
    app = platform_client(env)
    try:
        result = app.send_task("devtools.samples.nap", [4.0])
        wait_until(lambda: result.state == "STARTED", 30, "the nap to start")
        first = alive.stat().st_mtime
        # Busy (its only pool process sleeps): the main process still touches the file.
        wait_until(lambda: alive.stat().st_mtime > first, 10, "a heartbeat while busy")
        assert _liveness(probe, env) == 0
        worker.signal(signal.SIGSTOP)  # the main process hangs
        stale = time.time() - _probe_age(probe) - 5
        os.utime(alive, (stale, stale))
        time.sleep(1.5)  # three intervals: a live main process would have touched it
        assert alive.stat().st_mtime == stale
        assert _liveness(probe, env) != 0
        worker.signal(signal.SIGCONT)
        wait_until(lambda: _liveness(probe, env) == 0, 10, "the probe to pass again")
        assert result.get(timeout=30) == 4.0
    finally:
        worker.signal(signal.SIGCONT)
        worker.stop()
        app.close()
    assert not alive.exists(), "a stopped worker leaves no heartbeat behind"


@pytest.mark.timeout(150)
def test_the_prestop_hook_hands_a_stubborn_task_back_within_the_grace_period(
    worker_env: dict[str, str]
) -> None:
    """The worker's preStop (with the worker's pid for the container's pid 1): the warm
    shutdown waits one batch, the soft shutdown as long again, then the cold shutdown
    requeues the task that would not stop, at once; another worker runs it."""
    env = dict(worker_env, LEASE_TTL="1")
    fresh_database(env["DATABASE_URL"]).dispose()
    soft = soft_shutdown_timeout(load_settings(env))
    spec = by_kind("Deployment")["rangekeeper-worker"]["spec"]["template"]["spec"]
    script = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2]
    worker = start_worker(env, 1, "leaving")
    script = script.replace("P=1;", f"P={worker.pid};").replace(
        f"-lt {int(soft_shutdown_timeout(load_settings(manifest_env())))}", f"-lt {int(soft)}")
    app = platform_client(env)
    try:
        result = app.send_task("devtools.samples.nap", [40.0])
        wait_until(lambda: result.state == "STARTED", 30, "the nap to start")
        started = time.monotonic()
        # In a pod the hook ends with the container; here it would wait on the exited worker
        # (a zombie until this process reaps it), so the worker's exit is what is timed.
        hook = subprocess.Popen(["sh", "-c", script])
        try:
            worker.popen.wait(2 * soft + HANDOVER_SECONDS + 10)
        finally:
            hook.kill()
            hook.wait()
        took = time.monotonic() - started
        output = worker.output()
        assert "Soft Shutdown" in output and "Restoring 1 unacknowledged message" in output
        survivor = start_worker(env, 1, "staying")
        try:
            wait_until(lambda: f"nap[{result.id}] received" in survivor.output(), 60,
                       "the requeued nap on the other worker")
        finally:
            survivor.stop()
    finally:
        worker.stop()
        app.close()
    assert took < 2 * soft + HANDOVER_SECONDS + 10, f"the worker took {took:.1f}s to stop"


def probe_commands() -> dict[str, tuple[list[str], float]]:
    """Every k8s exec probe and compose health check that runs one of this project's entry
    points: its command as written (argv, or `sh -c` for a shell line) and its timeout."""
    found: dict[str, tuple[list[str], float]] = {}
    for name, container in containers().items():
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container.get(kind, {})
            if "exec" in probe and probe_argv(probe)[0] in ("celery", "python"):
                found[f"k8s {name} {kind}"] = (probe["exec"]["command"],
                                               float(probe.get("timeoutSeconds", 1)))
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in spec["services"].items():
        test = service.get("healthcheck", {}).get("test", [])
        argv = test[1:] if test[:1] == ["CMD"] else ["sh", "-c", test[1]] if test else []
        words = shlex.split(argv[2]) if argv[:2] == ["sh", "-c"] else argv
        if words and words[0] in ("celery", "python") and "urllib" not in " ".join(words):
            timeout = float(service["healthcheck"].get("timeout", "30s").rstrip("s"))
            found[f"compose {name}"] = (argv, timeout)
    return found


def _run_probe(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    bin_dir = str(Path(sys.executable).parent)
    env = dict(env, PATH=f"{bin_dir}:{env.get('PATH', '')}", HOSTNAME="probe-host")
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout + 10)
    assert time.monotonic() - started < timeout, f"{argv} ran past its timeout ({timeout}s)"
    return done.returncode, (done.stdout + done.stderr).strip()


def test_the_probes_run_a_command_that_fails_when_redis_or_the_database_is_away(
    worker_env: dict[str, str]
) -> None:
    """Issue 18 item 11: every probe command that reaches Redis exits non-zero with one clear
    line when REDIS_URL is a closed port; every one that reads the database, when DATABASE_URL
    cannot be reached (a worker's probes never read it: a database outage must not restart
    every worker)."""
    from tests.support.redis_server import free_port

    probes = probe_commands()
    assert {"k8s beat readinessProbe", "k8s console readinessProbe", "compose beat",
            "k8s worker readinessProbe", "k8s control readinessProbe"} <= set(probes)
    fresh_database(worker_env["DATABASE_URL"]).dispose()
    no_redis = dict(worker_env, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    no_db = dict(worker_env, DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:"
                                          f"{free_port()}/rangekeeper")
    for name, (argv, timeout) in probes.items():
        code, out = _run_probe(argv, no_redis, timeout)
        assert code != 0, f"{name}: exit 0 with Redis away\n{out[-1000:]}"
        last = out.splitlines()[-1]
        assert "Redis" in last or "broker" in last, f"{name}: {out[-1000:]}"
        assert "Traceback" not in out, f"{name}: {out[-2000:]}"
        if "tasks" in argv and "status" in argv:
            code, out = _run_probe(argv, no_db, timeout)
            assert code != 0 and "Traceback" not in out, f"{name}: {out[-1000:]}"
            assert out.splitlines()[-1].startswith("cannot use DATABASE_URL="), out[-1000:]
