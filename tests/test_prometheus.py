"""The metrics in a real Prometheus (Debian's `prometheus` package: the server and promtool,
which .ci/run installs when missing).

The alert rules pass `promtool check rules` and their unit tests (deploy/prometheus/
alerts_test.yml fires each one on synthetic series). Then a real worker and a real beat, each
on its own METRICS_PORT, run two range jobs (cm_data succeeds, cm_flaky fails a partition), a
real Prometheus server scrapes them every second (plus a target that does not answer: a worker
down), and every expression of the Grafana dashboard and of the alert rules is evaluated
through Prometheus's HTTP API: each returns the series it should, per range_job, queue, task
and kind, and no series carries `exported_job` (no label of ours is named `job`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select, update
from sqlalchemy.orm import sessionmaker

from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from tasks.deadletters.store import DeadLetters
from tasks.ranges.tables import WORK
from tests.support.control_jobs import BOOM
from tests.support.db import fresh_database
from tests.support.ports import free_port
from tests.support.workers import CELERY, ROOT, Proc, start_worker, wait_until

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "rangekeeper.json"
Series = dict[str, str]


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:  # a missing tool fails, as a missing service does
        pytest.fail(f"{name} not found: `apt-get install prometheus` (.ci/run installs it)")
    return found


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], cwd=PROMETHEUS_DIR, capture_output=True,
                          text=True, timeout=60)


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in board["panels"] for t in panel["targets"]]


def test_the_alert_rules_pass_promtool_and_each_one_fires_in_its_unit_test() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0 and "SUCCESS: 9 rules found" in checked.stdout, \
        checked.stdout + checked.stderr
    config = promtool("check", "config", "prometheus.yml")  # it loads alerts.yml
    assert config.returncode == 0, config.stdout + config.stderr
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    cases = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())["tests"]
    fired = {case["alertname"] for test in cases for case in test["alert_rule_test"]
             if case["exp_alerts"]}
    assert fired == {rule["alert"] for rule in alert_rules()}  # every alert, seen firing


class Prometheus:
    """A real Prometheus server on loopback, scraping `targets` every second, with the alert
    rules of deploy/prometheus/alerts.yml."""

    def __init__(self, tmp: Path, targets: list[str]) -> None:
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(PROMETHEUS_DIR / "alerts.yml")],
            "scrape_configs": [{"job_name": "rangekeeper",
                                "static_configs": [{"targets": targets}]}],
        }))
        self.proc = Proc([tool("prometheus"), f"--config.file={config}",
                          f"--storage.tsdb.path={tmp / 'data'}", "--log.level=warn",
                          f"--web.listen-address=127.0.0.1:{self.port}"], {}, "prometheus")
        wait_until(lambda: self._get("/-/ready") is not None, 30, "prometheus ready")

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                body = r.read().decode()
        except OSError:
            return None
        return json.loads(body) if path.startswith("/api/") else body

    def query(self, expr: str) -> list[tuple[Series, float]]:
        reply = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert reply is not None and reply["status"] == "success", (expr, reply)
        return [(r["metric"], float(r["value"][1])) for r in reply["data"]["result"]]

    def firing(self) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        alerts = self._get("/api/v1/alerts")["data"]["alerts"]
        return {(a["labels"]["alertname"], _key(a["labels"], "alertname", "severity"))
                for a in alerts if a["state"] == "firing"}

    def stop(self) -> None:
        self.proc.stop()


def _key(series: Series, *without: str) -> tuple[tuple[str, str], ...]:
    """The series' labels, without its name and `without`."""
    return tuple(sorted((k, v) for k, v in series.items()
                        if k not in without and k != "__name__"))


# What the scenario below makes: the label values each grouped dashboard expression must return
# (at least these), by label.
EXPECTED = {
    "range_job": {"cm_data", "cm_flaky"},
    "queue": {"celery", "control", "ranges", "restock"},
    "task": {"tasks.ranges.run_partition", "tasks.ranges.reconcile"},
    "kind": {"task", "range-partition"},
    "reason": {"refused", "expired", "other"},
    "node": {"0"},
    "state": {"failed"},
    "status": {"SUCCESS"},
    "result": {"compensated", "failed"},
}


# restock's `queue` is a node's delay queue, not a Celery queue
RESTOCK_QUEUES = {"q0", "q1"}


def expected(expr: str, label: str) -> set[str]:
    if label == "queue" and "rangekeeper_restock_" in expr:
        return RESTOCK_QUEUES
    return EXPECTED[label]


def grouped_by(expr: str) -> set[str]:
    return {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr)
            for label in group.split(",")} - {"le"}


@pytest.mark.timeout(150)
def test_a_real_prometheus_answers_every_dashboard_and_alert_expression(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    flaky = tmp_path / "flaky"
    flaky.touch()
    ports = {"worker": free_port(), "beat": free_port(), "down": free_port()}
    env = dict(worker_env, EXTRA_TASK_MODULES="tests.support.control_jobs",
               TEST_FLAKY_FILE=str(flaky), CM_DATA_PARTITION_SIZE="200",
               CM_DATA_BATCH_SIZE="100", LEASE_TTL="2", RECONCILE_INTERVAL="0.5",
               RESTOCK_SHARDS="2")
    engine = fresh_database(env["DATABASE_URL"])
    seed_cm_data(engine, 600)
    with engine.begin() as conn:  # cm_flaky's only partition fails at this row
        conn.execute(update(CM_DATA).where(CM_DATA.c.id == 350).values(payload=BOOM))
    procs: list[Proc] = []
    prometheus = None
    try:
        procs.append(start_worker(dict(env, METRICS_PORT=str(ports["worker"])), 2, "pw"))
        beat = Proc([*CELERY, "beat", "--loglevel=INFO"],
                    dict(env, METRICS_PORT=str(ports["beat"])), "beat")
        procs.append(beat)
        beat.wait_for("beat: became leader", timeout=30)
        prometheus = Prometheus(tmp_path, [f"127.0.0.1:{p}" for p in ports.values()])
        p = prometheus
        # dead letters scraped at 0 first, so the one added below is growth
        wait_until(lambda: p.query('rangekeeper_dead_letters{kind="task"} == 0'), 30,
                   "beat's state scraped")

        def statuses(job: str) -> list[str]:
            with engine.connect() as conn:
                return list(conn.execute(select(WORK.c.status).where(WORK.c.job == job))
                            .scalars())

        start("cm_flaky", env)
        wait_until(lambda: statuses("cm_flaky") == ["failed"], 60, "cm_flaky's partition failed")
        start("cm_data", env)
        # the rows cm_flaky processed leave cm_data's first partition empty
        wait_until(lambda: sorted(set(statuses("cm_data"))) == ["done", "empty"], 60,
                   "cm_data's partitions finished")
        DeadLetters(sessionmaker(engine)).add("task", "t-1", "capped", {"task": "x"})

        def settled() -> bool:
            runs = {(s["range_job"], s["state"]) for s, _ in
                    p.query("max by (range_job, state) (rangekeeper_range_run_state) == 1")}
            return runs == {("cm_data", "succeeded"), ("cm_flaky", "failed")} and bool(
                p.query('rangekeeper_dead_letters{kind="task"} == 1')) and bool(p.query(
                    'rangekeeper_task_runtime_seconds_count{task="tasks.ranges.run_partition"}'
                    ' >= 2'))

        wait_until(settled, 60, "both runs settled and scraped")
        check_dashboard(p)
        for series, took in p.query('scrape_duration_seconds{job="rangekeeper"}'):
            print(f"scrape of {series['instance']}: {took * 1000:.1f} ms")
        print("state read by the leading beat: {:.1f} ms".format(
            1000 * p.query("rangekeeper_state_collect_seconds")[0][1]))
        check_alerts(p, ports["down"])
        wait_until(lambda: {("RangekeeperPartitionFailed", (("range_job", "cm_flaky"),)),
                            ("RangekeeperDeadLettersGrowing", (("kind", "task"),))}
                   <= p.firing(), 20, "the alerts firing in Prometheus")
    finally:
        if prometheus is not None:
            prometheus.stop()
        for proc in reversed(procs):
            proc.stop()
        engine.dispose()


def start(job: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "tasks", "jobs", "start", job], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def check_dashboard(p: Prometheus) -> None:
    for expr in dashboard_exprs():
        found = p.query(expr)
        assert found, f"no series for {expr}"
        for label in grouped_by(expr):
            values = {series.get(label) for series, _ in found}
            assert expected(expr, label) <= values, (expr, label, values)
    parts = {(s["range_job"], s["state"]): v for s, v in
             p.query("max by (range_job, state) (rangekeeper_range_partitions)")}
    assert parts[("cm_data", "done")] + parts[("cm_data", "empty")] == 3, parts
    assert parts[("cm_data", "done")] >= 1 and parts[("cm_flaky", "failed")] == 1, parts
    done = dict((s["range_job"], v) for s, v in
                p.query("max by (range_job) (rangekeeper_range_rows_done)"))
    assert done["cm_data"] > 0, done
    # The state is served once (the leading beat), the task series by the worker.
    (state,) = p.query("count by (instance) (rangekeeper_range_partitions)")
    (ran,) = p.query('count by (instance) (rangekeeper_task_runtime_seconds_count)')
    assert state[0]["instance"] != ran[0]["instance"]
    assert {s["instance"] for s, v in p.query('up{job="rangekeeper"}') if v == 1} == {
        state[0]["instance"], ran[0]["instance"]}
    # `job` is the scrape job's: every series of ours has job="rangekeeper", none exported_job
    assert p.query('count by (job) ({__name__=~"rangekeeper_.+"})')[0][0] == {
        "job": "rangekeeper"}
    assert p.query('count({__name__=~"rangekeeper_.+", exported_job!=""})') == []


def check_alerts(p: Prometheus, down: int) -> None:
    """Each alert's expression returns who fires in this scenario (labels), and nobody else;
    the others return nothing, over series that do exist."""
    firing = {
        "RangekeeperWorkerDown": {(("instance", f"127.0.0.1:{down}"), ("job", "rangekeeper"))},
        "RangekeeperPartitionFailed": {(("range_job", "cm_flaky"),)},
        "RangekeeperDeadLettersGrowing": {(("kind", "task"),)},
    }
    exported = {s["__name__"] for s, _ in p.query('count by (__name__) ({__name__=~".+"})')}
    for rule in alert_rules():
        names = set(re.findall(r"\b(rangekeeper_[a-z_]+|up)\b", rule["expr"]))
        assert names <= exported, (rule["alert"], names - exported)  # no misspelt series
        got = {_key(series) for series, _ in p.query(rule["expr"])}
        assert got == firing.get(rule["alert"], set()), (rule["alert"], got)
