"""Range-job throttles on real prefork workers (issue 11): a cluster-wide cap in rows per second
shared by every worker (one gate.lua call per batch), lifted by `throttle JOB 0`; and a job's
`throttle_on`, whose wait keeps the partitions' leases alive.

The jobs are the control test jobs of tests.support.control_jobs (partitions of 5000 rows,
batches of 200).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker

from examples.seed import seed_cm_data
from examples.tables import CM_DATA
from lease import Leases
from tasks.ranges.controls import Controls
from tasks.ranges.gate import BACKOFF_CAP, Gate
from tasks.ranges.jobs import RangeJob
from tasks.ranges.keys import range_control_key
from tasks.ranges.tables import PartitionStatus as S
from tests.ranges.cluster import Platform
from tests.ranges.control_support import (
    control_platform,
    holders,
    idle,
    jobs_cli,
    processed,
)
from tests.support import control_jobs  # noqa: F401  (registers cm_throttled here too)
from tests.support.workers import celery_call, wait_until

pytestmark = pytest.mark.timeout(240)

CAP = 2000.0  # rows per second: cm_throttled's declared rows_per_s


def _start(cluster: Platform, job: str) -> None:
    sent = celery_call(cluster.env, "tasks.ranges.start", "--args", f'["{job}"]')
    assert sent.returncode == 0, sent.stderr


ROWS = 36_000  # room for a late first count, 12,000 rows under the cap and the lifted rest


def _time_to(engine: Engine, rows: int, timeout: float) -> tuple[float, int]:
    """When at least `rows` rows were processed (polled every 20 ms), and how many by then:
    the count is dated at the middle of its query (a busy machine's slow query would move a
    date taken after it)."""
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        done = processed(engine)
        if done >= rows:
            return (asked + time.monotonic()) / 2, done
        assert time.monotonic() < deadline, f"{done} of {rows} rows after {timeout}s"
        time.sleep(0.02)


@pytest.mark.parametrize("db_kind", ["sqlite", "mariadb"])
def test_a_cap_of_2000_rows_per_s_holds_over_two_workers_and_lifting_it_restores_speed(
        engine: Engine, platform: Callable[..., Platform]) -> None:
    seed_cm_data(engine, ROWS)
    cluster = control_platform(platform)
    cluster.worker("a")
    cluster.worker("b")
    cluster.beat()
    _start(cluster, "cm_throttled")
    t_a, done_a = _time_to(engine, 1000, 60)
    # 12,000 rows from the first count seen, however late a busy machine let this process see
    # it (at 12 xdist processes its first count once came after 13,000 rows): 6 s at the cap,
    # a batch's step is 3% of that.
    t_b, done_b = _time_to(engine, done_a + 12_000, 60)
    rate = (done_b - done_a) / (t_b - t_a)
    assert abs(rate - CAP) <= 0.1 * CAP, f"{rate:.0f} rows/s under a cap of {CAP:g}"
    assert sum(p.status == S.RUNNING for p in cluster.parts()) == 2  # both workers shared it
    # Lifted in this process through the same code as the CLI: a CLI process's start-up on a
    # loaded machine can outlast the rest of the run.
    client = redis.Redis.from_url(cluster.redis_server.url)
    controls = Controls(sessionmaker(engine), client, lambda job: {"dispatched": []})
    controls.throttle("cm_throttled", 0, "test")
    client.close()
    t_c, done_c = time.monotonic(), processed(engine)
    assert done_c < ROWS - 1000, "too few rows left to measure the lifted rate"
    cluster.wait_finished(timeout=60)
    rate_after = (ROWS - done_c) / (time.monotonic() - t_c)
    assert rate_after > 2 * CAP, f"{rate_after:.0f} rows/s after the cap was lifted"
    cluster.assert_exactly_once(ROWS)


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_throttle_on_holds_the_job_without_losing_its_leases_and_pause_stops_the_wait(
        engine: Engine, platform: Callable[..., Platform], tmp_path: Path) -> None:
    seed_cm_data(engine, 10_000)
    gate = tmp_path / "gate"
    gate.touch()
    cluster = control_platform(platform, TEST_GATE_FILE=str(gate))
    cluster.worker("a")
    cluster.worker("b")
    cluster.beat()
    _start(cluster, "cm_gated")
    wait_until(lambda: sorted(holders(cluster, "cm_gated")) == [0, 1], 60,
               "both partitions leased")
    before = {p.part: p.fence for p in cluster.parts()}
    time.sleep(3 * 1.5)  # three lease TTLs: leases that were not renewed would have lapsed
    parts = cluster.parts()
    assert processed(engine) == 0
    assert sorted(holders(cluster, "cm_gated")) == [0, 1]
    assert all(p.status == S.RUNNING and p.claims == 1 and p.fence == before[p.part]
               and p.throttled_until is not None for p in parts), parts
    paused = jobs_cli(cluster, "pause", "cm_gated")
    assert paused.returncode == 0, paused.stderr
    asked = time.monotonic()
    wait_until(lambda: idle(cluster, "cm_gated"), 30, "the waiting partitions paused")
    # One wait slice (a quarter of the 1.5 s TTL) and the poll's 0.1 s, with room for load.
    assert time.monotonic() - asked <= 1.5
    gate.unlink()
    resumed = jobs_cli(cluster, "resume", "cm_gated")
    assert resumed.returncode == 0, resumed.stderr
    cluster.wait_finished()
    cluster.assert_exactly_once(10_000)


class FakeClock:
    """Time that moves only when the gate sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def _job(**fields: object) -> RangeJob:
    return RangeJob(name="gate_test", table=CM_DATA, where=CM_DATA.c.status == 0,
                    process=lambda rows, ctx: None, batch_size=100, **fields)  # type: ignore[arg-type]


def test_throttle_on_backs_off_with_a_growing_capped_delay_in_slices(
        redis_client: redis.Redis, leases: Leases) -> None:
    answers = iter(["lag", "lag", "lag", "lag", "lag", "lag", "lag", None])
    clock = FakeClock()
    noted: list[float] = []
    gate = Gate(redis_client, _job(throttle_on=lambda _job: next(answers)), lease_ttl=4.0,
                note=noted.append, sleep=clock.sleep, clock=clock)
    with leases.acquire("gate-test", ttl=4.0) as lease:
        assert gate.before_batch(lease, 0) is None
    assert noted == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_CAP]
    assert max(clock.sleeps) <= 1.0  # a quarter of the TTL: the lease is heartbeaten between
    assert clock.now == pytest.approx(0.5 + 1 + 2 + 4 + 8 + 16 + BACKOFF_CAP)


def test_two_gates_of_one_job_share_its_rate(redis_client: redis.Redis, leases: Leases) -> None:
    job = _job()
    redis_client.hset(range_control_key(job.name), "rate", 1000)  # 100 rows per 0.1 s
    clock = FakeClock()  # the gates' waits pass at once; the server's TIME hardly moves
    gates = [Gate(redis_client, job, 4.0, sleep=clock.sleep, clock=clock) for _ in range(2)]
    waited = []
    with leases.acquire("gate-test", ttl=4.0) as lease:
        for i, gate in enumerate((*gates, *gates)):
            before = clock.now
            assert gate.before_batch(lease, 100 if i >= 2 else 0) is None
            waited.append(clock.now - before)
    # Four reservations of 100 rows from one arrival time, whichever gate asks (each gate's
    # previous batch processed the 100 rows it reserved: nothing to give back).
    # The server's clock runs on between the calls (tens of ms on a busy machine): a wait
    # is shorter by that much, never longer.
    assert waited == [0, pytest.approx(0.1, abs=0.05), pytest.approx(0.2, abs=0.05),
                      pytest.approx(0.3, abs=0.05)]
    with leases.acquire("gate-test-2", ttl=4.0) as lease:
        # A batch that processed nothing (an empty closing read) gives its 100 rows back.
        before = clock.now
        assert gates[0].before_batch(lease, 0) is None
        assert clock.now - before == pytest.approx(0.3, abs=0.05)
        redis_client.hset(range_control_key(job.name), "state", "paused")
        assert gates[1].before_batch(lease, 100) == "paused"
