"""Run parameters of range jobs (issue 21): declared as a dataclass on the job, given at start
from the CLI (`--param NAME=VALUE`) or `celery call` kwargs, refused with one clear line and
nothing written when unknown, missing or of the wrong type, stored on the run, shown in the
run history, and handed to `process` (`ctx.params`) and to a `where(params)` on real workers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, func, inspect, select, table
from sqlalchemy.orm import sessionmaker

from examples.seed import seed_cm_data
from tasks.ranges.controls import ControlRefused, Controls
from tasks.ranges.params import InvalidParams, build, encode, parse_pairs
from tasks.ranges.tables import RunState
from tests.ranges.cluster import DATA, Platform
from tests.ranges.control_support import jobs_cli, runs
from tests.support.param_jobs import Slice, payload_of
from tests.support.workers import celery_call, wait_until

pytestmark = pytest.mark.timeout(180)

MODULES = "bench.cm_data,tests.support.param_jobs"


@pytest.mark.parametrize(("given", "expected"), [
    ({"modulo": "3"}, Slice(3)),
    ({"modulo": 3, "remainder": "2"}, Slice(3, 2)),
    ({"modulo": "3", "ratio": "0.5", "loud": "yes"}, Slice(3, ratio=0.5, loud=True)),
    ({"modulo": 3, "ratio": 2, "loud": False}, Slice(3, ratio=2.0)),
    ({"modulo": "3", "loud": "off", "label": "x=y"}, Slice(3, label="x=y")),
    ({"modulo": "3", "since": "2026-01-01"}, Slice(3, since=date(2026, 1, 1))),
    ({"modulo": "3", "since": ""}, Slice(3)),
    ({"modulo": "3", "since": None}, Slice(3)),
    ({"modulo": "3", "until": "2026-01-01T02:30:00"},
     Slice(3, until=datetime(2026, 1, 1, 2, 30))),
])
def test_values_are_coerced_to_the_declared_field_types(given: dict[str, Any],
                                                        expected: Slice) -> None:
    assert build("j", Slice, given) == expected
    assert build("j", Slice, json.loads(encode(expected) or "{}")) == expected  # round trip


@pytest.mark.parametrize(("given", "said"), [
    ({}, "missing required parameter modulo"),
    ({"modulo": "3", "tenant": "1"}, "unknown parameter 'tenant'"),
    ({"modulo": "three"}, "modulo: 'three' is not an int"),
    ({"modulo": 3.5}, "modulo: 3.5 is not an int"),
    ({"modulo": True}, "modulo: True is not an int"),
    ({"modulo": "3", "ratio": "nan"}, "ratio: 'nan' is not a finite float"),
    ({"modulo": "3", "loud": "maybe"}, "loud: 'maybe' is not a bool"),
    ({"modulo": "3", "since": "2026-13-01"}, "since: '2026-13-01' is not a date"),
    ({"modulo": "3", "until": "soon"}, "until: 'soon' is not a datetime"),
    ({"modulo": "3", "label": 7}, "label: 7 is not a str"),
    ({"modulo": "3", "label": "x" * 2000}, "label: longer than"),
    ({"modulo": "0"}, "modulo must be at least 1"),
    ([1, 2], "parameters must be an object"),
])
def test_bad_values_are_refused_with_a_clear_message(given: Any, said: str) -> None:
    with pytest.raises(InvalidParams, match=said) as refused:
        build("cm_sliced", Slice, given)
    assert str(refused.value).startswith("cm_sliced: ") and "\n" not in str(refused.value)


def test_cli_pairs_are_split_at_the_first_equals_sign() -> None:
    assert parse_pairs(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(InvalidParams, match="NAME=VALUE"):
        parse_pairs(["novalue"])
    with pytest.raises(InvalidParams, match="given twice"):
        parse_pairs(["a=1", "a=2"])


def test_a_params_class_with_an_unsupported_field_is_refused_at_declaration() -> None:
    from tasks.ranges.jobs import RangeJob

    @dataclass
    class Bad:
        ids: list[int]

    with pytest.raises(ValueError, match="ids: list"):
        RangeJob(name="bad_params", table=DATA, where=DATA.c.status == 0,
                 process=lambda rows, ctx: None, params=Bad)
    with pytest.raises(ValueError, match="dataclass"):
        RangeJob(name="bad_params", table=DATA, where=DATA.c.status == 0,
                 process=lambda rows, ctx: None, params=dict)
    with pytest.raises(ValueError, match="params="):
        RangeJob(name="bad_params", table=DATA, where=lambda p: DATA.c.status == 0,
                 process=lambda rows, ctx: None)


def snapshot(engine: Engine, client: redis.Redis) -> tuple[dict[str, int], set[bytes]]:
    """The row count of every table of the database, and every Redis key."""
    with engine.connect() as conn:
        counts = {name: int(conn.execute(select(func.count()).select_from(table(name)))
                            .scalar_one()) for name in inspect(conn).get_table_names()}
    return counts, set(client.keys("*"))


REFUSALS = (
    (["cm_sliced"], "missing required parameter modulo"),
    (["cm_sliced", "--param", "modulo=2", "--param", "tenant=4"], "unknown parameter 'tenant'"),
    (["cm_sliced", "--param", "modulo=two"], "'two' is not an int"),
    (["cm_sliced", "--param", "modulo=2", "--param", "since=yesterday"],
     "'yesterday' is not a date"),
    (["cm_sliced", "--param", "modulo=0"], "modulo must be at least 1"),
    (["cm_sliced", "--param", "modulo"], "NAME=VALUE"),
    (["cm_data", "--param", "tenant=1"], "cm_data takes no parameters"),
    (["cm_sliced", "--dry-run", "--param", "modulo=2", "--param", "ratio=x"], "not a finite"),
)


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
def test_bad_params_are_refused_with_one_line_and_nothing_is_written(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 100)
    cluster = platform(EXTRA_TASK_MODULES=MODULES)
    client = redis.Redis.from_url(cluster.redis_server.url)
    before = snapshot(engine, client)
    # Every case on SQLite; missing, unknown and wrong type on the other two (each case is a
    # CLI process of about 2 s).
    for args, said in REFUSALS if engine.dialect.name == "sqlite" else REFUSALS[:3]:
        out = jobs_cli(cluster, "start", *args)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert snapshot(engine, client) == before
    assert runs(engine, "cm_sliced") == [] and runs(engine, "cm_data") == []
    client.close()


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_live_run_refuses_a_start_with_other_params(engine: Engine,
                                                      redis_client: redis.Redis) -> None:
    import tests.support.param_jobs  # noqa: F401  (registers cm_sliced in this process)

    controls = Controls(sessionmaker(engine, expire_on_commit=False), redis_client,
                        lambda job: {"dispatched": []})
    for given, said in (({"modulo": "x"}, "is not an int"), ([["modulo", 2]], "an object"),
                        (None, "missing required")):
        with pytest.raises(InvalidParams, match=said):
            controls.start("cm_sliced", "t", given)
    assert runs(engine, "cm_sliced") == [] and redis_client.keys("*") == []
    opened = controls.start("cm_sliced", "t", {"modulo": "2"})
    again = controls.start("cm_sliced", "t", {"modulo": 2, "remainder": 0})  # the same values
    assert again["run"] == opened["run"]
    assert controls.start("cm_sliced", "t")["run"] == opened["run"]  # none given: the run's
    with pytest.raises(ControlRefused, match="running with parameters"):
        controls.start("cm_sliced", "t", {"modulo": 3})
    (run,) = runs(engine, "cm_sliced")
    assert json.loads(run.params) == {"modulo": 2, "remainder": 0, "label": "slice",
                                      "ratio": 1.0, "loud": False, "since": None,
                                      "until": None}


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
def test_two_runs_with_different_params_reach_process_and_are_recorded_and_shown(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 3000)
    cluster = platform(EXTRA_TASK_MODULES=MODULES)
    cluster.worker("a")
    cluster.beat()
    sent = celery_call(cluster.env, "tasks.ranges.start", "--kwargs", json.dumps(
        {"job": "cm_sliced", "params": {"modulo": 2, "label": "even", "since": "2026-01-01"}}))
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: [r.state for r in runs(engine, "cm_sliced")] == [RunState.SUCCEEDED],
               60, "run 1 succeeded")
    started = jobs_cli(cluster, "start", "cm_sliced", "--param", "modulo=2",
                       "--param", "remainder=1", "--param", "label=odd", "--param", "loud=1")
    assert started.returncode == 0, started.stderr
    wait_until(lambda: [r.state for r in runs(engine, "cm_sliced")]
               == [RunState.SUCCEEDED] * 2, 60, "run 2 succeeded")
    even = payload_of(Slice(2, 0, "even", since=date(2026, 1, 1)))
    odd = payload_of(Slice(2, 1, "odd", loud=True))
    with engine.connect() as conn:
        got = dict(conn.execute(select(DATA.c.payload, func.count()).where(
            DATA.c.processed_count == 1).group_by(DATA.c.payload)).all())
        twice = conn.execute(select(func.count()).where(DATA.c.processed_count != 1)).scalar()
    assert got == {even: 1500, odd: 1500} and twice == 0
    first, second = runs(engine, "cm_sliced")
    assert (first.rows, second.rows) == (1500, 1500)
    history = jobs_cli(cluster, "runs", "cm_sliced", "--json")
    assert history.returncode == 0, history.stderr
    shown = [r["params"] for r in json.loads(history.stdout)["items"]]
    assert [p["label"] for p in shown] == ["odd", "even"]
    assert shown[1]["since"] == "2026-01-01" and shown[0]["loud"] is True
    text = jobs_cli(cluster, "runs", "cm_sliced")
    assert "params modulo=2 remainder=1 label=odd" in text.stdout, text.stdout
    assert "since=2026-01-01" in text.stdout
