"""Collections (issue 21): a CSV given at start, stored as the run's input and walked in line
ranges under the same leases and fences as a table, and a custom resumable collection (a
paginated API) run as one partition whose checkpoint is its cursor. A CSV with a bad record is
refused with one line naming it, and nothing is written. On real workers, each item once under
kill -9 of the worker holding a batch in flight.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, func, inspect, select, table
from sqlalchemy.orm import sessionmaker

from tasks.ranges.collections import BadInput, read_csv
from tasks.ranges.controls import ControlRefused, Controls
from tasks.ranges.dryrun import dry_run
from tasks.ranges.tables import RUN_INPUT, WORK, RunState
from tasks.store.validate import InvalidArguments
from tests.ranges.cluster import Platform
from tests.ranges.control_support import jobs_cli, runs
from tests.support.sink import fake_api
from tests.support.visit_jobs import VISIT_EXPORT, api_copy, csv_copy, recreate
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(180)

MODULES = "bench.cm_data,tests.support.visit_jobs"


def _csv(tmp_path: Path, content: str | bytes) -> str:
    path = tmp_path / "input.csv"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return str(path)


def test_records_become_json_objects_keyed_by_the_header(tmp_path: Path) -> None:
    path = _csv(tmp_path, 'id,name\n1,"a, quoted"\n\n2,"two\nlines"\n3,é\n')
    assert [json.loads(r) for r in read_csv(path)] == [
        {"id": "1", "name": "a, quoted"}, {"id": "2", "name": "two\nlines"},
        {"id": "3", "name": "é"}]


@pytest.mark.parametrize(("content", "said"), [
    ("", "line 1: a header line"),
    ("id,,x\n1,2,3\n", "line 1: the header has an empty name (field 2)"),
    ("id,name,id\n", "line 1: the header names 'id' twice"),
    ("id,name\n1,a\n2\n3,c\n", "line 3: 1 fields, but the header has 2"),
    ("id,name\n1,a\n2,b,extra\n", "line 3: 3 fields, but the header has 2"),
    ('id,name\n1,a\n2,"open\n', "line 3: unexpected end of data"),
    ('id,name\n1,"a"b\n', "line 2: ',' expected after '\"'"),
    (b"id,name\n1,a\n2,\xff\n", "line 3: not UTF-8 text"),
    ("id\n1\n2\n3\n", "line 4: more than 2 records"),
])
def test_a_bad_csv_is_refused_naming_the_line(tmp_path: Path, content: str | bytes,
                                              said: str) -> None:
    path = _csv(tmp_path, content)
    with pytest.raises(BadInput, match=re.escape(said)) as refused:
        read_csv(path, max_lines=2)
    assert str(refused.value).startswith(f"{path}: ") and "\n" not in str(refused.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read it"):
        read_csv(str(tmp_path / "nope.csv"))


def test_a_collection_refuses_what_applies_to_tables_and_dict_keys() -> None:
    from tasks.ranges.collections import COLLECTION_PARTITION, collection_job
    from tasks.ranges.jobs import Context

    def pages(cursor: object, size: int) -> tuple[list[dict[str, int]], None]:
        return [], None

    with pytest.raises(ValueError, match="skip_on applies to a table's rows"):
        collection_job("bad_pages", pages, lambda items, ctx: None, skip_on=(KeyError,),
                       skip_limit=1)
    job = collection_job("some_pages", pages, lambda items, ctx: None)
    ctx = Context(None, 3, job, COLLECTION_PARTITION, run=7)  # type: ignore[arg-type]
    assert ctx.idempotency_key(42) == "some_pages:7:42"
    with pytest.raises(TypeError, match=re.escape("pass its key, ctx.idempotency_key(item")):
        ctx.idempotency_key({"id": 42})


def _snapshot(engine: Engine, client: redis.Redis) -> tuple[dict[str, int], set[bytes]]:
    with engine.connect() as conn:
        counts = {name: int(conn.execute(select(func.count()).select_from(table(name)))
                            .scalar_one()) for name in inspect(conn).get_table_names()}
    return counts, set(client.keys("*"))


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_refused_start_writes_nothing(engine: Engine, platform: Callable[..., Platform],
                                        tmp_path: Path) -> None:
    cluster = platform(EXTRA_TASK_MODULES=MODULES)
    client = redis.Redis.from_url(cluster.redis_server.url)
    before = _snapshot(engine, client)
    bad = _csv(tmp_path, "id,name\n" + "".join(f"{i},n{i}\n" for i in range(1, 500))
               + "500,n500,oops\n")
    good = str(tmp_path / "good.csv")
    Path(good).write_text("id,name\n1,a\n")
    for args, said in (
            (["csv_copy", "--csv", bad], f"{bad}: line 501: 3 fields, but the header has 2"),
            (["csv_copy"], "a CSV job's run needs its input")):
        out = jobs_cli(cluster, "start", *args)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    # The same refusals in-process, and the ones the CLI shares with the Celery task.
    controls = Controls(sessionmaker(engine), client, lambda job: {"dispatched": []})
    for job, records, said in (("cm_export", read_csv(good), "the job takes no CSV"),
                               ("csv_copy", None, "needs its input")):
        with pytest.raises(ControlRefused, match=said):
            controls.start(job, "t", None, records=records)
    for job in (csv_copy, api_copy):
        with pytest.raises(InvalidArguments, match="a dry run reads a table"):
            dry_run(sessionmaker(engine), job, None, None)
    assert _snapshot(engine, client) == before
    assert runs(engine, "csv_copy") == [] and runs(engine, "cm_export") == []
    client.close()


def _hold_env(tmp_path: Path, after: int) -> tuple[Path, dict[str, str]]:
    hold = tmp_path / "hold"
    hold.write_text("")
    return hold, {"VISIT_HOLD_FILE": str(hold), "VISIT_HOLD_AFTER": str(after)}


def _held_ids(hold: Path) -> list[int]:
    marker = Path(f"{hold}.held")
    return wait_until(lambda: marker.exists() and marker.read_text()
                      and json.loads(marker.read_text()), 60, "a batch held in flight")


def _copies(engine: Engine) -> Counter[tuple[int, int]]:
    with engine.connect() as conn:
        return Counter((int(r.run), int(r.source_id)) for r in conn.execute(
            select(VISIT_EXPORT.c.run, VISIT_EXPORT.c.source_id)).all())


def _kill_held_then_finish(cluster: Platform, engine: Engine, job: str, hold: Path,
                           *start: str) -> list[int]:
    """Start `job`, kill -9 the worker holding a batch in flight, let a survivor finish the
    run; the held batch's ids."""
    doomed = cluster.worker("doomed")
    cluster.beat()
    started = jobs_cli(cluster, "start", job, *start)
    assert started.returncode == 0, started.stderr
    held = _held_ids(hold)  # its rows are copied in its transaction, not committed
    doomed.kill()
    hold.unlink()
    cluster.worker("survivor")
    wait_until(lambda: [r.state for r in runs(engine, job)] == [RunState.SUCCEEDED], 90,
               f"{job}'s run to succeed")
    return held


@pytest.mark.parametrize("db_kind", ["mariadb"])
def test_a_csv_of_10000_lines_is_visited_once_under_kill_9(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    recreate(engine)
    path = _csv(tmp_path, "name,size\n" + "".join(f"line-{i},{i % 7}\n"
                                                 for i in range(1, 10_001)))
    hold, env = _hold_env(tmp_path, 1000)
    cluster = platform(EXTRA_TASK_MODULES=MODULES, **env)
    held = _kill_held_then_finish(cluster, engine, "csv_copy", hold, "--csv", path)
    (run,) = runs(engine, "csv_copy")
    assert _copies(engine) == Counter({(run.id, i): 1 for i in range(1, 10_001)})
    assert run.rows == 10_000
    with engine.connect() as conn:
        notes = dict(conn.execute(select(VISIT_EXPORT.c.source_id, VISIT_EXPORT.c.note)
                                  .where(VISIT_EXPORT.c.source_id.in_([1, held[0], 10_000])))
                     .all())
        stored = conn.execute(select(func.count()).select_from(RUN_INPUT)
                              .where(RUN_INPUT.c.run == run.id)).scalar()
        parts = conn.execute(select(WORK.c.lo, WORK.c.hi, WORK.c.claims)
                             .where(WORK.c.job == "csv_copy").order_by(WORK.c.lo)).all()
    assert notes == {1: "line-1", held[0]: f"line-{held[0]}", 10_000: "line-10000"}
    assert stored == 10_000
    assert [(p.lo, p.hi) for p in parts] == [(1, 2500), (2501, 5000), (5001, 7500),
                                             (7501, 10_000)]
    assert held == list(range(1001, 1501))
    assert max(p.claims for p in parts if p.lo <= held[0] <= p.hi) >= 2


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_a_paginated_api_is_visited_once_under_kill_9(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    recreate(engine)
    hold, env = _hold_env(tmp_path, 300)
    with fake_api(2000) as url:
        cluster = platform(EXTRA_TASK_MODULES=MODULES, VISIT_API_URL=url, **env)
        held = _kill_held_then_finish(cluster, engine, "api_copy", hold)
    (run,) = runs(engine, "api_copy")
    assert _copies(engine) == Counter({(run.id, i): 1 for i in range(1, 2001)})
    assert held == list(range(301, 401))
    (part,) = cluster.parts()
    assert part.claims >= 2 and part.status == "done" and part.collection_cursor is None
    with engine.connect() as conn:
        keys = set(conn.execute(select(VISIT_EXPORT.c.note)).scalars())
    assert keys == {f"api_copy:{run.id}:{i}" for i in range(1, 2001)}
