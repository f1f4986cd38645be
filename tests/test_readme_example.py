"""The README's "Declaring a range job" snippet, as written, is a job a user can copy: it is all
of examples/cm_data.py, and copied into a module of one's own (`myjobs.py`) and named in
EXTRA_TASK_MODULES, as the README says, it runs on a real worker against a real database and
Redis and processes every row still to do exactly once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update

from examples.tables import CM_DATA
from tasks.ranges.tables import WORK, PartitionStatus
from tests.support.db import fresh_database
from tests.support.workers import ROOT, celery_call, start_worker, wait_until

README = ROOT / "README.md"
ROWS = 1200
ALREADY_DONE = 100  # rows seeded as done: the job's filter must leave them alone


def readme_snippet() -> str:
    """The first Python block of the README's "Declaring a range job" section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Declaring a range job\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "no python block in README's 'Declaring a range job'"
    return found.group(1)


def test_the_readme_snippet_is_the_example_module_as_written() -> None:
    assert readme_snippet() == (ROOT / "examples" / "cm_data.py").read_text(encoding="utf-8")


def _copied(tmp_path: Path) -> Path:
    """The snippet saved as a user's own module, `myjobs.py`, in a directory of its own."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "myjobs.py").write_text(readme_snippet(), encoding="utf-8")
    return project


def _user_env(worker_env: dict[str, str], project: Path, db_url: str) -> dict[str, str]:
    # The user's directory first; the checkout for the platform and the example's table.
    return dict(worker_env, PYTHONPATH=f"{project}:{ROOT}", EXTRA_TASK_MODULES="myjobs",
                DATABASE_URL=db_url, CM_DATA_PARTITION_SIZE="500", CM_DATA_BATCH_SIZE="100",
                LEASE_TTL="3")


def _counts(engine: Engine) -> dict[int, int]:
    """processed_count per row id."""
    with engine.connect() as conn:
        rows = conn.execute(select(CM_DATA.c.id, CM_DATA.c.processed_count)).all()
    return {int(r.id): int(r.processed_count) for r in rows}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"], indirect=True)
def test_the_readme_snippet_runs_on_a_real_worker_and_processes_each_row_once(
    worker_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    env = _user_env(worker_env, _copied(tmp_path), db_url)
    engine = fresh_database(db_url)
    try:
        seeded = subprocess.run([sys.executable, "-m", "examples.seed", "--rows", str(ROWS)],
                                env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert seeded.returncode == 0, seeded.stderr
        assert f"seeded ids 1..{ROWS}" in seeded.stdout
        with engine.begin() as conn:
            conn.execute(update(CM_DATA).where(CM_DATA.c.id <= ALREADY_DONE).values(status=1))
        worker = start_worker(env, 2)
        try:
            started = celery_call(env, "tasks.ranges.start", "--args", '["cm_data"]')
            assert started.returncode == 0, started.stderr

            def finished() -> bool:
                with engine.connect() as conn:
                    states = conn.execute(select(WORK.c.status).where(
                        WORK.c.job == "cm_data")).scalars().all()
                    left = conn.execute(select(func.count()).where(
                        CM_DATA.c.status == 0)).scalar_one()
                return len(states) == 3 and left == 0 and all(
                    s in PartitionStatus.FINISHED for s in states)

            wait_until(finished, 120, "the snippet's job to process every row")
        finally:
            worker.stop()
        counts = _counts(engine)
        assert len(counts) == ROWS
        assert {i for i, n in counts.items() if n != 1} == set(range(1, ALREADY_DONE + 1))
        assert {counts[i] for i in range(1, ALREADY_DONE + 1)} == {0}  # left alone
        with engine.connect() as conn:
            assert conn.execute(select(func.min(CM_DATA.c.processed_fence)).where(
                CM_DATA.c.id > ALREADY_DONE)).scalar_one() >= 1
    finally:
        engine.dispose()


def test_a_bad_knob_of_the_snippet_stops_its_import_naming_the_variable(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(_user_env(worker_env, _copied(tmp_path), worker_env["DATABASE_URL"]),
               CM_DATA_BATCH_SIZE="1k")
    imported = subprocess.run([sys.executable, "-c", "import myjobs"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    assert imported.returncode == 1
    assert "CM_DATA_BATCH_SIZE='1k' is not a number >= 0" in imported.stderr
