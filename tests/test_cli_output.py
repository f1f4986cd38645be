"""What every CLI command prints (issue 22), on one populated database: a job started with a
throttle, a run with parameters, a schedule, dead letters (one replayed), and partitions of a
job with a long name. Text output speaks words (no Python repr, times with their zone); every
`--json` is one envelope; a refusal under `--json` is an `error` envelope on stderr; `status`
filters by job and section; in an 80- and a 60-column terminal no line is wider and no name or
header is split mid-word."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import sessionmaker

from tasks.cli.fit import Col, records, widths
from tasks.cli.words import duration, pairs, word
from tasks.deadletters.store import DeadLetters
from tasks.ranges.tables import WORK
from tasks.store.db import utcnow
from tests import SAMPLE_MODULES
from tests.support import forkcli
from tests.support.workers import ROOT, platform_env
from tests.test_status_cli import _in_terminal

LONG = "email_backfill_for_tenants"
OWNER = "w-long-worker-name@build-host-17.example.internal:123456"
REPR = re.compile(r"\bTrue\b|\bFalse\b|\bNone\b|[\[\]{}]")
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
TIME_KEYS = ("at", "due", "next_due", "last_due", "queued")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "tasks", *args], env, ROOT, 120)


def _ok(env: dict[str, str], *args: str) -> str:
    done = cli(env, *args)
    assert done.returncode == 0, (args, done.stderr[-2000:])
    return done.stdout


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    import redis

    from tests import WORKER_REDIS_URL
    from tests.support.db import fresh_database

    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    url = f"sqlite:///{tmp_path_factory.mktemp('out') / 'out.sqlite'}"
    engine = fresh_database(url)
    env = platform_env(REDIS_URL=WORKER_REDIS_URL, DATABASE_URL=url,
                       EXTRA_TASK_MODULES=f"{SAMPLE_MODULES},tests.support.param_jobs")
    seeded = forkcli.run([sys.executable, "-m", "examples.seed", "--rows", "300"], env, ROOT, 120)
    assert seeded.returncode == 0, seeded.stderr
    _ok(env, "jobs", "start", "cm_data")  # no worker: it stays pending, nothing races
    _ok(env, "jobs", "throttle", "cm_data", "5")
    _ok(env, "jobs", "start", "cm_sliced", "--param", "modulo=2", "--param", "remainder=1",
        "--param", "loud=true", "--param", "since=2026-01-01")
    _ok(env, "jobs", "schedule", "cm_data", "0 0 2 * * *")
    letters = DeadLetters(sessionmaker(engine))
    letters.add("task", "4f9d2c1e-1111-2222-3333-444455556666", "capped after 5 deliveries",
                {"task": "devtools.samples.nap", "args": [1], "kwargs": {}})
    letters.add("range-partition", "cm_data:3", "partition failed for good",
                {"job": "cm_data", "part": 3})
    _ok(env, "deadletters", "replay", "1")  # sent to the broker; no worker needs to run it
    shapes = [("done", None), ("running", OWNER), ("pending", None), ("failed", None)]
    with engine.begin() as conn:
        conn.execute(insert(WORK), [
            {"kind": "range", "job": LONG, "part": p, "lo": p * 250_000 + 1,
             "hi": (p + 1) * 250_000, "next_id": p * 250_000 + 1 + 1000 * p, "fence": 3,
             "status": state, "owner": owner, "claims": 2, "rows_done": 1000 * p,
             "rate": 40.0 if owner else 0.0, "heartbeat_at": utcnow(),
             "error": "ValueError: row 760001 is bad" if state == "failed" else None}
            for p, (state, owner) in enumerate(shapes)])
    engine.dispose()
    yield env


TEXT_COMMANDS = [
    ("status",), ("status", "--job", LONG), ("jobs", "runs", "cm_data"),
    ("jobs", "runs", "cm_sliced"), ("jobs", "run", "cm_sliced", "1"), ("jobs", "schedules"),
    ("jobs", "schedule", "cm_data"), ("jobs", "start", "cm_sliced", "--dry-run", "--param",
                                      "modulo=3"),
    ("jobs", "throttle", "cm_data", "6"), ("deadletters", "list"), ("deadletters", "show", "1"),
    ("deadletters", "show", "2"),
]


@pytest.mark.parametrize("args", TEXT_COMMANDS, ids=" ".join)
def test_text_output_is_words_with_zoned_times(populated: dict[str, str],
                                               args: tuple[str, ...]) -> None:
    out = _ok(populated, *args)
    # `deadletters show` ends with the payload, printed as the JSON it is.
    text = out.split("\npayload:\n")[0]
    assert text.strip() and not REPR.search(text), text
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d", text), text  # no ISO stamp for people
    stamps = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( UTC)?", text)
    assert all(stamps), text  # every time says its zone
    if args[:2] in (("deadletters", "show"), ("jobs", "runs"), ("jobs", "schedules")):
        assert stamps, text


def test_text_output_names_values_in_words(populated: dict[str, str]) -> None:
    shown = _ok(populated, "deadletters", "show", "1")
    assert "replayable: no" in shown and re.search(r"replayed_at: \S+ \S+ UTC", shown)
    other = _ok(populated, "deadletters", "show", "2")
    assert "replayable: no" in other and "replayed_at: -" in other
    runs = _ok(populated, "jobs", "runs", "cm_sliced")
    assert "params modulo=2 remainder=1 label=slice ratio=1 loud=true since=2026-01-01" in runs
    throttled = _ok(populated, "jobs", "throttle", "cm_data", "7")
    assert "cm_data run 1: running (rows/s 7" in throttled, throttled
    # In words, whatever its length by now ("9.9 s" under ten seconds on a loaded machine).
    assert re.search(r"duration \d+(\.\d)? (ms|s|min|h|d)( \d+ (s|min|h))?\b", runs), runs


JSON_COMMANDS = [
    (("status",), "status", "item"), (("jobs", "runs", "cm_data"), "run", "items"),
    (("jobs", "run", "cm_sliced", "1"), "run", "item"),
    (("jobs", "schedules"), "schedule", "items"),
    (("jobs", "schedule", "cm_data"), "schedule", "item"),
    (("jobs", "start", "cm_sliced", "--dry-run", "--param", "modulo=3"), "dry_run", "item"),
    (("jobs", "start", "cm_data"), "control", "item"),
    (("deadletters", "list"), "dead_letter", "items"),
    (("deadletters", "show", "1"), "dead_letter", "item"),
]


@pytest.mark.parametrize(("args", "kind", "body"), JSON_COMMANDS, ids=lambda a: " ".join(a)
                         if isinstance(a, tuple) else a)
def test_every_json_output_is_one_envelope(populated: dict[str, str], args: tuple[str, ...],
                                           kind: str, body: str) -> None:
    out = _ok(populated, *args, "--json")
    [line] = out.splitlines()
    data = json.loads(line)
    assert list(data) == ["version", "kind", body] and data["version"] == 1
    assert data["kind"] == kind
    assert isinstance(data[body], dict if body == "item" else list) and data[body]
    times = list(_times(data[body]))
    assert all(ISO.match(t) for t in times), times
    if kind in ("run", "dead_letter", "schedule", "status"):
        assert times, data


def _times(value: Any) -> Iterator[str]:
    """Every string held under a time's key (`*_at`, `at`, `due`, ...), anywhere in `value`."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if isinstance(inner, str) and (key.endswith("_at") or key in TIME_KEYS):
                yield inner
            else:
                yield from _times(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _times(inner)


@pytest.mark.parametrize(("env_extra", "args", "code", "says"), [
    ({}, ("jobs", "start", "nope"), 1, "unknown range job 'nope'"),
    ({}, ("status", "--section", "bogus"), 1, "--section 'bogus' is not one of"),
    ({}, ("jobs", "runs"), 2, "Missing argument 'JOB'"),
    ({}, ("deadletters", "show", "99"), 1, "no dead letter with id 99"),
    ({"LEASE_TTL": "abc"}, ("status",), 2, "LEASE_TTL='abc' is not a number"),
])
def test_a_refusal_under_json_is_an_error_envelope_on_stderr(
    populated: dict[str, str], env_extra: dict[str, str], args: tuple[str, ...], code: int,
    says: str
) -> None:
    done = cli(dict(populated, **env_extra), *args, "--json")
    assert done.returncode == code and done.stdout == "", done.stdout
    [line] = done.stderr.splitlines()
    refusal = json.loads(line)
    assert (refusal["version"], refusal["kind"], refusal["item"]["exit_code"]) == (1, "error",
                                                                                  code)
    assert says in refusal["item"]["message"], refusal
    plain = cli(dict(populated, **env_extra), *args)
    assert plain.returncode == code and says in plain.stderr and not plain.stderr.startswith("{")


def test_status_filters_by_job_and_by_section(populated: dict[str, str]) -> None:
    one = _ok(populated, "status", "--job", LONG)
    assert LONG in one and "cm_sliced" not in one and "cm_data" not in one
    assert "restock shards" not in one and "dead letters" not in one and "queues:" not in one
    shards = _ok(populated, "status", "--section", "restock")
    assert "restock shards" in shards and "range jobs" not in shards and LONG not in shards
    both = _ok(populated, "status", "--section", "letters,queues")
    assert "newest 2 dead letters" in both and "queues:" in both and "restock shards" not in both
    item = json.loads(_ok(populated, "status", "--json", "--job", LONG))["item"]
    assert item["sections"] == ["ranges"] and [j["job"] for j in item["jobs"]] == [LONG]
    assert {p["job"] for p in item["partitions"]} == {LONG} and "dead_letters" not in item
    again = json.loads(_ok(populated, "status", "--json", "--job", LONG, "--section",
                           "ranges,letters"))["item"]
    assert again["sections"] == ["ranges", "letters"] and again["dead_letters"]["total"] == 2


WHOLE = (LONG, "maintenance", "checkpoint", "takeovers", "pending", "running",
         "range-partition", "2026-01-01")
TERMINAL_COMMANDS = [("status",), ("jobs", "runs", "cm_sliced"), ("jobs", "schedules"),
                     ("deadletters", "list"), ("deadletters", "show", "1"),
                     ("jobs", "start", "cm_sliced", "--dry-run", "--param", "modulo=3")]


@pytest.mark.parametrize("columns", [80, 60])
@pytest.mark.parametrize("command", TERMINAL_COMMANDS, ids=" ".join)
def test_a_narrow_terminal_gets_no_wider_line_and_no_split_word(
    populated: dict[str, str], columns: int, command: tuple[str, ...]
) -> None:
    out, code = _in_terminal(populated, [], columns=columns, command=command)
    assert code == 0, out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= columns, out
    tokens = _tokens(out)
    # A piece of a split word is a token the piped output (one line per row) never prints.
    pieces = tokens - _tokens(_ok(populated, *command))
    for word_ in WHOLE:
        cut = [t for t in pieces if 3 <= len(t) < len(word_) and word_.startswith(t)
               and not t.isdigit()]
        assert not cut, (word_, cut, out)
    if command == ("status",):
        assert LONG in tokens and "partitions" in out and "restock shards" in out


def _tokens(out: str) -> set[str]:
    return set(re.findall(r"[\w@.:-]+", out))


@pytest.mark.parametrize(("seconds", "said"), [
    (None, "-"), (0.25, "250 ms"), (4.25, "4.2 s"), (4.0, "4 s"), (45, "45 s"),
    (184, "3 min 4 s"), (180, "3 min"), (3725, "1 h 2 min"), (2 * 86_400 + 3600, "2 d 1 h"),
])
def test_durations_are_spoken(seconds: float | None, said: str) -> None:
    assert duration(seconds) == said


@pytest.mark.parametrize(("value", "said"), [
    (True, "yes"), (False, "no"), (None, "-"), ("", "-"), ([1, 2], "1, 2"), ([], "none"),
    ({"a": 1, "b": None, "c": True}, "a=1 b= c=true"), (1234567, "1,234,567"), (2.5, "2.5"),
])
def test_values_are_words(value: Any, said: str) -> None:
    assert word(value) == said
    assert pairs(None) == "-"


def test_a_table_fits_or_falls_back_to_blocks() -> None:
    cols = (Col("job"), Col("state", whole=False), Col("rows", right=True))
    rows = [(LONG, "failed: ValueError: row 7 is bad", "1,000")]
    fixed = widths(cols, rows, 200)
    assert fixed == [len(LONG), len(rows[0][1]), 5]  # wide enough: each column its longest line
    narrow = widths(cols, rows, 60)
    assert narrow is not None and narrow[0] == len(LONG) and sum(narrow) + 3 * 3 + 1 <= 60
    assert widths(cols, rows, 40) is None  # the name alone and the others do not fit
    assert records("jobs", cols, rows) == ["jobs", LONG, "  state: failed: ValueError: row 7 "
                                           "is bad", "  rows: 1,000"]
    assert records("", (Col("part\nids"), Col("a\nb")), [("3\n1..9", "x\ny")]) == [
        "part 3, 1..9", "  a: x", "  b: y"]
