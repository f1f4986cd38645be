"""`python -m tasks jobs start JOB --dry-run` (issue 21): the plan with estimated rows, the
first batch's SQL and rows, an ETA from a timed sample read, and no write at all (no run, no
lease, no Redis key, no work row), on the three databases."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from sqlalchemy import Engine, and_, func, select, update

from examples.seed import seed_cm_data
from tasks.ranges.dryrun import estimate_rows
from tests.ranges.cluster import DATA, Platform
from tests.ranges.control_support import jobs_cli, runs
from tests.ranges.test_params import MODULES, snapshot

pytestmark = pytest.mark.timeout(120)

ROWS = 30_000


def _seed_skewed(engine: Engine) -> None:
    """30,000 rows, the first 6,000 and every 7th already done: a filter of uneven density."""
    seed_cm_data(engine, ROWS)
    with engine.begin() as conn:
        conn.execute(update(DATA).where((DATA.c.id <= 6000) | (DATA.c.id % 7 == 0))
                     .values(status=1))


def _matching(engine: Engine, lo: int, hi: int, modulo: int = 3) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(
            DATA.c.id.between(lo, hi), DATA.c.status == 0,
            DATA.c.id % modulo == 0)).scalar_one())


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
def test_dry_run_writes_nothing_and_estimates_within_20_percent(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    _seed_skewed(engine)
    cluster = platform(EXTRA_TASK_MODULES=MODULES)
    client = redis.Redis.from_url(cluster.redis_server.url)
    before = snapshot(engine, client)
    out = jobs_cli(cluster, "start", "cm_sliced", "--dry-run", "--json", "--param", "modulo=3")
    assert out.returncode == 0, out.stderr
    assert snapshot(engine, client) == before
    assert runs(engine, "cm_sliced") == []
    client.close()
    plan = json.loads(out.stdout)["item"]
    assert plan["job"] == "cm_sliced" and plan["params"]["modulo"] == 3
    assert plan["partitions_total"] == ROWS // 2000
    real = _matching(engine, 1, ROWS)
    assert abs(plan["estimated_rows"] - real) <= 0.2 * real, (plan["estimated_rows"], real)
    assert plan["partitions"][0]["lo"] == 1 and plan["partitions"][0]["hi"] == 2000
    for part in plan["partitions"]:
        true = _matching(engine, part["lo"], part["hi"])
        assert abs(part["estimated_rows"] - true) <= max(0.2 * true, 1), (part, true)
    assert "cm_data" in plan["sql"] and "6001" in plan["sql"], plan["sql"]
    assert 0 < len(plan["rows"]) <= 5
    assert all(r["id"] > 6000 and r["id"] % 3 == 0 and r["id"] % 7 for r in plan["rows"])
    assert plan["sample"]["rows"] == 200 and plan["sample"]["seconds"] > 0
    assert plan["eta_s"] > 0


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_dry_run_text_shows_the_plan_the_sql_the_rows_and_an_eta(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    _seed_skewed(engine)
    cluster = platform(EXTRA_TASK_MODULES=MODULES)
    out = jobs_cli(cluster, "start", "cm_noted", "--dry-run")
    assert out.returncode == 0, out.stderr
    for said in ("dry run of cm_noted", "15 partitions", "estimated rows", "part 0",
                 "first batch", "SELECT", "first rows", "ETA", "nothing was written"):
        assert said in out.stdout, (said, out.stdout)
    assert runs(engine, "cm_noted") == []


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_sampled_estimate_stays_within_20_percent_of_the_count(engine: Engine) -> None:
    _seed_skewed(engine)
    where = and_(DATA.c.status == 0, DATA.c.id % 3 == 0)
    real = _matching(engine, 1, ROWS)
    with engine.connect() as conn:
        exact = estimate_rows(conn, DATA, DATA.c.id, where, 1, ROWS, budget=ROWS)
        sampled = estimate_rows(conn, DATA, DATA.c.id, where, 1, ROWS, budget=3000)
        beyond = estimate_rows(conn, DATA, DATA.c.id, where, ROWS + 1, 2 * ROWS, budget=3000)
    assert exact.rows == real and exact.exact
    assert abs(sampled.rows - real) <= 0.2 * real and not sampled.exact
    assert beyond.rows == 0
