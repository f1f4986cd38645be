"""Cron schedules of range jobs (issue 21): expressions and policies (pure), the tick's
policies against a real database with a clock the test moves (a job every 10 s whose runs
outlast that: no worker runs them, so a run stays live until the test ends it), the CLI, and
two real beats whose leader is killed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from tasks.ranges.controls import Controls
from tasks.ranges.cron import InvalidSchedule, due_at, parse_cron
from tasks.ranges.jobs import _JOBS, RangeJob, register
from tasks.ranges.runs import change_state, current_run, events_of, writing
from tasks.ranges.tables import JOB_SCHEDULES, RANGE_RUN_EVENTS, RANGE_RUNS, RunState
from tasks.ranges.timetable import Fire, clear_schedule, set_schedule, tick, views
from tests.ranges.cluster import Platform
from tests.ranges.control_support import jobs_cli
from tests.support.workers import CELERY, Proc, wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def db_kind() -> str:
    """SQLite unless a test names its databases: the logic is the database's compare-and-set
    UPDATEs, which PostgreSQL runs too where it matters."""
    return "sqlite"

T0 = datetime(2026, 3, 1, 2, 0, 0)  # a due time of every schedule below
EVERY_10S = "*/10 * * * * *"


def _noop(rows: Any, ctx: Any) -> None:
    raise AssertionError("no partition runs in these tests")


@pytest.mark.parametrize("expr, first_after_t0", [
    ("0 2 * * *", T0 + timedelta(days=1)),
    ("*/10 * * * * *", T0 + timedelta(seconds=10)),
    ("30 0 2 * * *", T0 + timedelta(seconds=30)),  # seconds first
    ("@hourly", T0 + timedelta(hours=1)),
    ("  0   2 * * *  ", T0 + timedelta(days=1)),
])
def test_a_cron_expression_gives_its_due_times(expr: str, first_after_t0: datetime) -> None:
    assert parse_cron(expr).after(T0) == first_after_t0


@pytest.mark.parametrize("expr, says", [
    ("61 * * * *", "not a valid cron expression"),
    ("* * *", "has 5 fields"),
    ("* * * * * * * *", "has 5 fields"),
    ("", "must be a cron expression"),
    (None, "must be a cron expression"),
    ("H * * * *", "not a valid cron expression"),
])
def test_a_bad_cron_expression_is_refused(expr: object, says: str) -> None:
    with pytest.raises(InvalidSchedule, match=says):
        parse_cron(expr)


def test_due_times_passed_are_counted_and_a_late_one_is_missed() -> None:
    cron = parse_cron(EVERY_10S)
    on_time = due_at(cron, T0, T0 + timedelta(seconds=1), grace=60)
    assert on_time is not None and (on_time.at, on_time.covers, on_time.late) == (T0, 1, False)
    down = due_at(cron, T0, T0 + timedelta(hours=1, seconds=5), grace=60)
    assert down is not None and down.covers == 361 and not down.late  # 01:00:00 is on time
    nightly = due_at(parse_cron("0 2 * * *"), T0, T0 + timedelta(hours=3), grace=60)
    assert nightly is not None and nightly.late and nightly.next_at == T0 + timedelta(days=1)
    assert due_at(cron, T0, T0 - timedelta(seconds=1), grace=60) is None


class Clock:
    """The ticks' `now`, moved by the test."""

    def __init__(self) -> None:
        self.now = T0 - timedelta(seconds=1)

    def at(self, seconds: float) -> datetime:
        self.now = T0 + timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def job() -> Iterator[RangeJob]:
    found = register(RangeJob(name="every_10s", table=CM_DATA, where=CM_DATA.c.status == 0,
                              process=_noop))
    yield found
    _JOBS.pop(found.name, None)


class Ticks:
    """Ticks of the schedule on the test's database; a run stays live until `end` ends it."""

    def __init__(self, sessions: sessionmaker[Session], controls: Controls, job: RangeJob,
                 policy: str, missed: str = "once") -> None:
        self.sessions, self.controls, self.job = sessions, controls, job
        self.clock = Clock()
        set_schedule(sessions, job, EVERY_10S, policy, missed, now=self.clock.now)

    def at(self, seconds: float) -> list[Fire]:
        return tick(self.sessions, [self.job], self._start, self.controls.cancel, grace=5,
                    now=self.clock.at(seconds))

    def _start(self, job: str, actor: str, then: Any) -> object:
        return self.controls.start(job, actor, None, then)

    def end(self) -> None:
        run = current_run(self.sessions, self.job.name)
        assert run is not None
        with writing(self.sessions) as session:
            assert change_state(session, run, RunState.SUCCEEDED)

    def runs(self) -> list[tuple[int, str]]:
        with self.sessions() as session:
            return [(r.id, r.state) for r in session.execute(
                select(RANGE_RUNS.c.id, RANGE_RUNS.c.state).where(
                    RANGE_RUNS.c.job == self.job.name).order_by(RANGE_RUNS.c.id))]

    def events(self, run_id: int) -> list[tuple[str, str, str | None]]:
        return [(e.verb, e.actor, e.detail) for e in events_of(self.sessions, [run_id])[run_id]]


@pytest.fixture
def ticks(sessions: sessionmaker[Session], redis_client: Any,
          job: RangeJob) -> Callable[..., Ticks]:
    controls = Controls(sessions, redis_client, lambda job: {})
    return lambda policy, missed="once": Ticks(sessions, controls, job, policy, missed)


def _outcomes(fires: list[Fire]) -> list[str]:
    return [f.outcome for f in fires]


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"])
def test_skip_policy_skips_due_times_while_a_run_is_live(ticks: Callable[..., Ticks]) -> None:
    t = ticks("skip")
    assert t.at(-0.5) == []  # not due yet
    assert _outcomes(t.at(0.2)) == ["started"]
    assert t.at(3) == []  # the same due time fires once
    first = t.runs()[0][0]
    assert _outcomes(t.at(10.1)) == ["skipped"]  # the run is longer than the period
    assert _outcomes(t.at(20.3)) == ["skipped"]
    t.end()
    assert _outcomes(t.at(30.1)) == ["started"]
    assert [s for _, s in t.runs()] == ["succeeded", "running"]
    verbs = [(v, a) for v, a, _ in t.events(first)]
    assert verbs[:2] == [("start", "schedule"), ("scheduled", "schedule")]
    assert verbs.count(("schedule-skip", "schedule")) == 2
    assert "due 2026-03-01T02:00:00Z" in str(t.events(first)[1][2])


def test_replace_policy_cancels_the_live_run_and_starts_a_new_one(
        ticks: Callable[..., Ticks]) -> None:
    t = ticks("replace")
    assert _outcomes(t.at(0.1)) == ["started"]
    assert _outcomes(t.at(10.1)) == ["replaced"]
    assert _outcomes(t.at(20.1)) == ["replaced"]
    assert [s for _, s in t.runs()] == ["cancelled", "cancelled", "running"]
    first = t.runs()[0][0]
    assert ("cancel", "schedule") in [(v, a) for v, a, _ in t.events(first)]


def test_queue_policy_holds_one_run_until_the_live_one_ends(
        ticks: Callable[..., Ticks]) -> None:
    t = ticks("queue")
    assert _outcomes(t.at(0.1)) == ["started"]
    assert _outcomes(t.at(10.1)) == ["queued"]
    assert t.at(12) == []  # the run is still live: the queued one waits
    assert _outcomes(t.at(20.1)) == ["skipped"]  # at most one queued
    t.end()
    fires = t.at(21)
    assert _outcomes(fires) == ["started"] and fires[0].due == T0 + timedelta(seconds=10)
    assert t.at(22) == []  # the queued run started once
    assert [s for _, s in t.runs()] == ["succeeded", "running"]
    assert _outcomes(t.at(30.1)) == ["queued"]


def test_a_queued_run_whose_live_run_ends_just_before_the_next_due_time_starts_once(
        ticks: Callable[..., Ticks]) -> None:
    """The live run ends, and before the next tick the next due time has come too: one run
    starts, for the queued due time, the other folded into it (seen live on a busy machine)."""
    t = ticks("queue")
    assert _outcomes(t.at(0.1)) == ["started"]
    assert _outcomes(t.at(10.1)) == ["queued"]
    t.end()
    fires = t.at(20.1)
    assert _outcomes(fires) == ["started"] and fires[0].due == T0 + timedelta(seconds=10)
    assert t.at(21) == [] and t.at(25) == []  # neither due time starts a second run
    assert [s for _, s in t.runs()] == ["succeeded", "running"]
    second = t.runs()[1][0]
    detail = next(d for v, _, d in t.events(second) if v == "scheduled")
    assert str(detail).startswith("due 2026-03-01T02:00:10Z (queued), with due "
                                  "2026-03-01T02:00:20Z"), detail
    assert _outcomes(t.at(30.1)) == ["queued"]


@pytest.mark.parametrize("missed, outcome, runs", [("once", "started", 1), ("skip", "missed", 0)])
def test_a_window_missed_while_no_beat_ran_follows_the_missed_policy(
        ticks: Callable[..., Ticks], missed: str, outcome: str, runs: int) -> None:
    t = ticks("skip", missed)
    # The beat was down from before T0 until 95 s later; the latest due time (T0+90s) is 5 s
    # past, beyond the 5 s grace, so it was missed too.
    fires = t.at(95.5)
    assert _outcomes(fires) == [outcome]
    assert fires[0].due == T0 + timedelta(seconds=90) and "covering 9 earlier" in fires[0].detail
    assert len(t.runs()) == runs
    assert t.at(96) == []  # counted once
    view = views(t.sessions, [t.job])[0]
    assert view["next_due"] == "2026-03-01T02:01:40Z" and view["last_outcome"].startswith(
        outcome)


def test_two_ticks_that_read_the_same_due_time_start_one_run(
        ticks: Callable[..., Ticks]) -> None:
    """The second tick (another beat's) read the row before the first one's fire committed:
    its compare-and-set finds a newer term, so its start rolls back."""
    t = ticks("skip")
    with t.sessions() as session:
        stale = session.execute(select(JOB_SCHEDULES)).one()
    assert _outcomes(t.at(0.1)) == ["started"]
    from tasks.ranges import timetable

    fire = timetable._start(t.sessions, stale, t._start, T0, "due again",
                            next_due_at=T0 + timedelta(seconds=10))
    assert fire.outcome == "overtaken" and len(t.runs()) == 1


def test_set_change_clear_and_refusals_store_nothing_bad(
        sessions: sessionmaker[Session], job: RangeJob) -> None:
    for cron, policy, missed in [("61 * * * *", "skip", "once"), (EVERY_10S, "sometimes", "once"),
                                 (EVERY_10S, "skip", "twice")]:
        with pytest.raises(InvalidSchedule):
            set_schedule(sessions, job, cron, policy, missed)
    with sessions() as session:
        assert session.execute(select(func.count()).select_from(JOB_SCHEDULES)).scalar() == 0
    set_schedule(sessions, job, "0 2 * * *", "queue", "skip", now=T0)
    with pytest.raises(InvalidSchedule):
        set_schedule(sessions, job, "0 2 * *", "skip", "once")
    assert views(sessions, [job])[0]["cron"] == "0 2 * * *"
    clear_schedule(sessions, job)
    assert views(sessions, [job])[0]["cron"] is None
    assert tick(sessions, [job], _never, _never, grace=5, now=T0 + timedelta(days=9)) == []


def _never(*args: Any) -> object:
    raise AssertionError("nothing is due")


def test_a_schedule_declared_in_code_is_seeded_and_follows_the_code(
        sessions: sessionmaker[Session]) -> None:
    try:
        declared = register(RangeJob(name="nightly", table=CM_DATA, where=CM_DATA.c.status == 0,
                                     process=_noop, schedule="0 2 * * *",
                                     schedule_policy="queue"))
        assert tick(sessions, [declared], _never, _never, grace=5, now=T0) == []
        view = views(sessions, [declared])[0]
        assert (view["source"], view["policy"], view["next_due"]) == (
            "code", "queue", "2026-03-02T02:00:00Z")
        with pytest.raises(ValueError, match="range job bad_cron: schedule"):
            RangeJob(name="bad_cron", table=CM_DATA, where=CM_DATA.c.status == 0,
                     process=_noop, schedule="0 25 * * *")
        with pytest.raises(ValueError, match="schedule policy must be one of"):
            RangeJob(name="bad_cron", table=CM_DATA, where=CM_DATA.c.status == 0,
                     process=_noop, schedule="0 2 * * *", schedule_policy="always")
    finally:
        _JOBS.pop("nightly", None)


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_cli_sets_shows_and_clears_and_refuses_bad_input_with_one_line(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    cluster = platform()
    bad = jobs_cli(cluster, "schedule", "cm_data", "*/10 * * * * *", "--policy", "maybe")
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0
    assert "schedule policy must be one of skip, replace, queue" in bad.stderr
    bad = jobs_cli(cluster, "schedule", "cm_data", "0 2 * *")
    assert bad.returncode == 1 and "has 5 fields" in bad.stderr
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(JOB_SCHEDULES)).scalar() == 0
    done = jobs_cli(cluster, "schedule", "cm_data", "*/10 * * * * *", "--policy", "replace",
                    "--missed", "skip")
    assert done.returncode == 0, done.stderr
    assert '"*/10 * * * * *" UTC  policy replace  missed skip' in done.stdout
    listed = jobs_cli(cluster, "schedules")
    assert "cm_data" in listed.stdout and "policy replace" in listed.stdout
    cleared = jobs_cli(cluster, "schedule", "cm_data", "--clear")
    assert cleared.returncode == 0 and "cm_data: no schedule" in cleared.stdout


def _beat(cluster: Platform, name: str) -> Proc:
    """A beat at DEBUG: frequent entries' "Sending due task" lines show only there."""
    proc = Proc([*CELERY, "beat", "--loglevel=DEBUG"], cluster.env, name)
    cluster.procs.append(proc)
    return proc


DUE = re.compile(r"due (\S+Z)(?:, covering (\d+) earlier)?")


def _due_times(engine: Engine) -> list[tuple[str, int]]:
    """The due time (and the earlier ones it covered) of every fire recorded on a run."""
    with engine.connect() as conn:
        details = conn.execute(select(RANGE_RUN_EVENTS.c.detail).where(
            RANGE_RUN_EVENTS.c.verb.in_(("scheduled", "schedule-skip")))
            .order_by(RANGE_RUN_EVENTS.c.id)).scalars().all()
    found = []
    for detail in details:
        match = DUE.search(detail or "")
        assert match, detail
        found.append((match.group(1), int(match.group(2) or 0)))
    return found


@pytest.mark.parametrize("db_kind", ["postgresql"])
def test_two_beats_with_the_leader_killed_fire_each_due_time_once(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, 200)
    cluster = platform(RANGE_SCHEDULE_TICK="0.5", RANGE_SCHEDULE_GRACE="30")
    done = jobs_cli(cluster, "schedule", "cm_data", "*/2 * * * * *")
    assert done.returncode == 0, done.stderr
    cluster.worker("w")
    leader = _beat(cluster, "beat-a")
    leader.wait_for("became leader", timeout=60)
    standby = _beat(cluster, "beat-b")
    standby.wait_for("beat: Starting...", timeout=60)
    wait_until(lambda: len(_due_times(engine)) >= 2, 30, "two fires by the first leader")
    assert "Sending due task range-schedules" not in standby.output()
    before = len(_due_times(engine))
    leader.kill()
    standby.wait_for("became leader", timeout=10)
    wait_until(lambda: len(_due_times(engine)) >= before + 3, 30, "fires by the new leader")
    assert "Sending due task range-schedules" in standby.output()
    fired = _due_times(engine)
    times = [datetime.fromisoformat(at.rstrip("Z")) for at, _ in fired]
    assert len(set(times)) == len(times), f"a due time fired twice: {fired}"
    assert times == sorted(times)
    # Every due time from the first to the last is accounted for: fired, skipped, or covered
    # by a fire after the failover.
    span = int((times[-1] - times[0]).total_seconds()) // 2 + 1
    assert sum(1 + covered for _, covered in fired[1:]) + 1 == span, fired
    with engine.connect() as conn:
        starters = conn.execute(select(RANGE_RUN_EVENTS.c.actor).where(
            RANGE_RUN_EVENTS.c.verb == "start")).scalars().all()
    assert len(starters) >= 2 and set(starters) == {"schedule"}
