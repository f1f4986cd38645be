"""`python -m tasks status` as an operator runs it (issue 11): in an 80-column terminal (a real
pseudo-terminal) nothing is cut and nothing is wider than the terminal; piped, every value is
whole on one line; `--json` is one object; `--watch` redraws until Ctrl-C; a partition's owner
is the Celery worker's name plus its pool process's pid, read while a real worker runs it."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from rich.console import Console
from sqlalchemy import Engine, insert, update

from tasks.cli.render import partitions_table
from tasks.deadletters.store import DeadLetters
from tasks.ranges.status import PartitionView, format_eta, summarize
from tasks.ranges.tables import WORK
from tasks.store.db import utcnow
from tests.support import forkcli
from tests.support.workers import ROOT, start_worker, wait_until

OWNER = "w-long-worker-name@build-host-17.example.internal:123456"
ERROR = "ValueError: row 760001 is bad: the payload column holds a 300-character value"
JOB = "cm_data_backfill_2026"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def status_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "tasks", "status", *args], env, ROOT, 120)


@pytest.fixture
def migrated(worker_env: dict[str, str]) -> Any:
    from tests.support.db import fresh_database

    engine = fresh_database(worker_env["DATABASE_URL"])
    yield worker_env, engine
    engine.dispose()


def _plan(engine: Engine) -> None:
    """Four partitions of 250,000 ids: done, running (a long owner), pending, failed."""
    shapes = [("done", None, 250_001, 250_000, 0.0), ("running", OWNER, 300_001, 50_000, 40_000.0),
              ("pending", None, 500_001, 0, 0.0), ("failed", None, 760_001, 10_000, 0.0)]
    with engine.begin() as conn:
        conn.execute(insert(WORK), [
            {"kind": "range", "job": JOB, "part": p, "lo": p * 250_000 + 1,
             "hi": (p + 1) * 250_000, "next_id": checkpoint, "fence": 3, "status": state,
             "owner": owner, "claims": 2, "rows_done": done, "rate": rate,
             "error": ERROR if state == "failed" else None, "heartbeat_at": utcnow()}
            for p, (state, owner, checkpoint, done, rate) in enumerate(shapes)])


def _in_terminal(env: dict[str, str], args: list[str], columns: int = 80,
                 until: Callable[[bytes], bool] | None = None,
                 timeout: float = 60, command: tuple[str, ...] = ("status",)
                 ) -> tuple[str, int | None]:
    """Run `COMMAND ARGS` (`status` unless told) on a pseudo-terminal `columns` wide (and
    COLUMNS saying so); return its output (colours stripped) and exit code. With `until`,
    send SIGINT (Ctrl-C) once `until(output)` holds."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    term_env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    term_env.update(TERM="xterm-256color", COLUMNS=str(columns))
    proc = subprocess.Popen([sys.executable, "-m", "tasks", *command, *args], cwd=ROOT,
                            env=term_env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    interrupted = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        if until is not None and not interrupted and until(b"".join(chunks)):
            proc.send_signal(signal.SIGINT)
            interrupted = True
        if proc.poll() is not None and not ready:
            break
    code = proc.wait(timeout=20)
    os.close(master)
    text = ANSI.sub("", b"".join(chunks).decode("utf-8", "replace")).replace("\r\n", "\n")
    return text, code


def test_an_80_column_terminal_gets_everything_and_nothing_wider(migrated: Any) -> None:
    env, engine = migrated
    _plan(engine)
    out, code = _in_terminal(env, [])
    assert code == 0, out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    assert "…" not in out and "cm_d…" not in out
    assert f"partitions of {JOB}" in out  # the compact layout names the job once
    assert "31.0%" in out and "40,000" in out  # the job's summary line
    for whole in ("250001..500000", "750001..1000000", "300001"):
        assert any(whole in line for line in lines), whole  # numbers are never folded
    # Folded text is all there, a piece per line of its cell.
    joined = re.sub(r"\s+", "", out)
    assert "ValueError" in joined and "w-long" in joined


def test_piped_output_keeps_every_value_whole_on_one_line(migrated: Any) -> None:
    env, engine = migrated
    _plan(engine)
    run = status_cli(dict(env, COLUMNS="80"))
    assert run.returncode == 0, run.stderr
    assert "…" not in run.stdout
    [running] = [line for line in run.stdout.splitlines() if OWNER in line]
    assert "250001..500000" in running and "running" in running
    [failed] = [line for line in run.stdout.splitlines() if ERROR in line]
    assert "750001..1000000" in failed
    [summary] = [line for line in run.stdout.splitlines() if "310,000 of 1,000,000" in line]
    assert JOB in summary and "running" in summary and "40,000" in summary


def test_json_is_one_object_with_jobs_partitions_nodes_and_letters(migrated: Any) -> None:
    env, engine = migrated
    _plan(engine)
    DeadLetters(_sessions(engine)).add("task", "t-1", "capped", {"task": "x", "args": [],
                                                                 "kwargs": {}})
    run = status_cli(env, "--json")
    assert run.returncode == 0, run.stderr
    envelope = json.loads(run.stdout)
    assert (envelope["version"], envelope["kind"]) == (1, "status")
    data = envelope["item"]
    assert data["sections"] == ["ranges", "restock", "letters", "queues"]
    [job] = data["jobs"]
    assert job["job"] == JOB and job["state"] == "running"
    assert job["rows_done"] == 310_000 and job["ids_planned"] == 1_000_000
    assert job["ids_walked"] == 250_000 + 50_000 + 0 + 10_000
    assert job["rows_per_s"] == 40_000 and job["eta_s"] > 0
    assert job["partitions"] == {"done": 1, "failed": 1, "pending": 1, "running": 1}
    assert [p["owner"] for p in data["partitions"]] == [None, OWNER, None, None]
    assert data["partitions"][3]["error"] == ERROR
    assert data["restock_nodes"][0]["node"] == 0
    assert data["dead_letters"]["counts"] == {"task": 1}
    assert data["dead_letters"]["recent"][0]["created_at"].endswith("Z")
    assert data["partitions"][0]["heartbeat_at"].endswith("Z")
    only = json.loads(status_cli(env, "--json", "--job", "nope").stdout)["item"]
    assert only["jobs"] == [] and only["partitions"] == []
    assert "restock_nodes" not in only and only["sections"] == ["ranges"]
    both = status_cli(env, "--json", "--watch")
    assert both.returncode == 2 and "do not go together" in both.stderr


def test_watch_redraws_until_ctrl_c(migrated: Any) -> None:
    env, engine = migrated
    _plan(engine)
    seen: list[bool] = []

    def changed(out: bytes) -> bool:
        if not seen and b"310,000" in out:
            seen.append(True)
            with engine.begin() as conn:  # progress between two refreshes
                conn.execute(update(WORK).where(WORK.c.part == 2).values(rows_done=4242))
        return b"314,242" in out

    out, code = _in_terminal(env, ["--watch", "0.5"], columns=120, until=changed)
    assert code == 0, out
    assert "314,242" in out and "Traceback" not in out and "aborted" not in out


@pytest.mark.timeout(300)
def test_the_owner_is_the_worker_name_and_its_pool_pid(migrated: Any, tmp_path: Path) -> None:
    env, engine = migrated
    env = dict(env, CM_DATA_PARTITION_SIZE="1000", CM_DATA_BATCH_SIZE="50",
               CM_DATA_BATCH_DELAY="0.3", CM_DATA_PARALLELISM="1")
    seeded = forkcli.run([sys.executable, "-m", "examples.seed", "--rows", "2000"], env, ROOT, 120)
    assert seeded.returncode == 0, seeded.stderr
    # Started and held back (2,000 rows take 100 s) before any worker runs, so a partition is
    # still running when the piped status below is read, however busy the machine; the hold
    # is lifted once it was.
    for verb in (["start", "cm_data"], ["throttle", "cm_data", "20"]):
        done = forkcli.run([sys.executable, "-m", "tasks", "jobs", *verb], env, ROOT, 120)
        assert done.returncode == 0, done.stderr
    name = f"wst{uuid.uuid4().hex[:6]}"
    worker = start_worker(env, 2, name)
    app = Celery(broker=env["REDIS_URL"], backend=env["REDIS_URL"], set_as_current=False)
    try:

        def running() -> list[dict[str, Any]]:
            data = json.loads(status_cli(env, "--json").stdout)["item"]
            return [p for p in data["partitions"] if p["status"] == "running" and p["owner"]]

        part = wait_until(running, 90, "a running partition")[0]
        host = socket.gethostname()
        match = re.fullmatch(rf"{name}@{re.escape(host)}:(\d+)", part["owner"])
        assert match, part["owner"]
        pid = int(match.group(1))
        assert pid != worker.pid and _parent(pid) == worker.pid  # a pool process of the worker
        piped = status_cli(env).stdout
        assert part["owner"] in piped
        # Lifted by the CLI, which writes the cap itself: both pool processes may be busy.
        lifted = forkcli.run([sys.executable, "-m", "tasks", "jobs", "throttle", "cm_data", "0"],
                             env, ROOT, 120)
        assert lifted.returncode == 0, lifted.stderr

        def finished() -> dict[str, Any] | None:
            [job] = json.loads(status_cli(env, "--json").stdout)["item"]["jobs"]
            return job if job["partitions"] == {"done": 2} else None

        job = wait_until(finished, 90, "every partition done")
        if job["run"] is not None:
            # With a run history the run ends at the next reconcile round (beat's, here sent
            # by hand): the run's state is then the job's.
            app.send_task("tasks.ranges.reconcile").get(timeout=60)
            job = json.loads(status_cli(env, "--json").stdout)["item"]["jobs"][0]
    finally:
        worker.stop()
        app.close()
    assert job["rows_done"] == 2000 and job["ids_walked"] == job["ids_planned"] == 2000
    assert job["eta_s"] is None
    assert job["state"] == ("done" if job["run"] is None else "succeeded"), job


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _sessions(engine: Engine) -> Any:
    from sqlalchemy.orm import sessionmaker

    return sessionmaker(engine)


def test_piped_watch_prints_one_snapshot_after_another(migrated: Any) -> None:
    env, engine = migrated
    _plan(engine)
    proc = subprocess.Popen([sys.executable, "-m", "tasks", "status", "--watch", "0.3"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    stamps: list[str] = []
    try:
        while len(stamps) < 2:
            line = proc.stdout.readline().decode()
            assert line, proc.stderr.read().decode() if proc.stderr else ""
            if line.startswith("status at "):
                stamps.append(line)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err


def test_a_job_without_partitions_is_named(migrated: Any) -> None:
    env, engine = migrated
    _plan(engine)
    run = status_cli(env, "--job", "nope")
    assert run.returncode == 0
    assert "range job 'nope' has no partitions (never started, or no such job)" in run.stdout
    assert JOB not in run.stdout


def _view(part: int, status: str, checkpoint: int, rows: int, rate: float = 0.0,
          throttled_for: float | None = None) -> PartitionView:
    until = utcnow() + timedelta(seconds=throttled_for) if throttled_for is not None else None
    return PartitionView("j", part, part * 100 + 1, (part + 1) * 100, status, None, checkpoint,
                         rows, rate, 1, 1, None, None, until)


@pytest.mark.parametrize(("views", "state", "walked", "eta"), [
    # 101 of 200 ids walked for 50 rows (2.02 ids a row), 10 rows/s: 99 ids left at 20.2/s.
    ([_view(0, "done", 101, 40), _view(1, "running", 101 + 1, 10, rate=10.0)],
     "running", 101, 99 / 20.2),
    ([_view(0, "done", 101, 40), _view(1, "pending", 101, 0)], "pending", 100, None),
    ([_view(0, "done", 101, 40), _view(1, "failed", 150, 5)], "failed", 149, None),
    ([_view(0, "empty", 1, 0), _view(1, "done", 201, 7)], "done", 200, None),
    ([_view(0, "paused", 50, 20), _view(1, "done", 201, 7)], "paused", 149, None),
])
def test_a_jobs_summary_is_read_from_its_partitions(
    views: list[PartitionView], state: str, walked: int, eta: float | None,
) -> None:
    [summary] = summarize(views)
    assert summary.state == state and summary.ids_walked == walked
    assert summary.ids_planned == 200
    assert summary.eta_s == (pytest.approx(eta) if eta is not None else None)


def test_a_partition_waiting_for_its_throttle_shows_the_wait() -> None:
    out = StringIO()
    Console(file=out, width=200).print(partitions_table([
        _view(0, "running", 50, 10, rate=5.0, throttled_for=3.0),
        _view(1, "running", 150, 10, rate=5.0, throttled_for=-1.0)]))
    lines = out.getvalue().splitlines()
    assert any("running, throttled 3 s" in line or "running, throttled 2.9 s" in line
               for line in lines), out.getvalue()
    assert sum("throttled" in line for line in lines) == 1  # a past wait is not shown
    assert format_eta(3725) == "1h02m" and format_eta(65) == "1m05s" and format_eta(None) == "-"


@pytest.mark.parametrize("args", [["--json"], []])
def test_status_exits_non_zero_with_one_line_when_redis_is_unreachable(
    migrated: Any, args: list[str]
) -> None:
    """Issue 18 item 11: the compose and k8s readiness probes run `status --json`; with REDIS_URL
    on a closed port it used to print the snapshot and exit 0."""
    from tests.support.redis_server import free_port

    env, engine = migrated
    _plan(engine)
    closed = f"redis://:pw-never-shown@127.0.0.1:{free_port()}/0"
    run = status_cli(dict(env, REDIS_URL=closed), *args)
    assert run.returncode == 1, run.stdout[-500:]
    assert run.stdout == ""
    [line] = run.stderr.splitlines()
    if args:  # under --json the refusal is the error envelope, its message the same line
        refusal = json.loads(line)
        assert (refusal["kind"], refusal["item"]["exit_code"]) == ("error", 1)
        line = refusal["item"]["message"]
    assert line.startswith("cannot reach Redis (REDIS_URL=redis://:***@127.0.0.1:"), line
    assert "pw-never-shown" not in run.stderr


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres:pw-never-shown@127.0.0.1:{port}/rangekeeper",
    "mysql+pymysql://root:pw-never-shown@127.0.0.1:{port}/rangekeeper",
])
def test_status_exits_non_zero_with_one_line_when_the_database_is_unreachable(
    worker_env: dict[str, str], url: str
) -> None:
    from tests.support.redis_server import free_port

    run = status_cli(dict(worker_env, DATABASE_URL=url.format(port=free_port())), "--json")
    assert run.returncode == 1, run.stdout[-500:]
    assert run.stdout == ""
    [line] = run.stderr.splitlines()
    refusal = json.loads(line)["item"]
    assert refusal["message"].startswith("cannot use DATABASE_URL="), line
    assert refusal["exit_code"] == 1
    assert "pw-never-shown" not in run.stderr and "Traceback" not in run.stderr
