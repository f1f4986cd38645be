"""A model-based test of the range-job protocol on the real code (issue 18).

Hypothesis' stateful testing drives the real reconciler, runners and controls in-process, on a
real Redis and a real database, through random sequences of: start, reconcile rounds, holders
that run a few batches and hand back, holders that crash (after their claim, at a batch
boundary, inside a batch), holders paused past their lease (before a batch, or with its rows
read and its guard not yet run) and let go later, lease expiry, Redis restarting empty, the
control verbs, inserts with explicit ids (below a finished checkpoint, above the table's max,
below the first partition, anywhere) and deletes (a partition's highest ids, any row).

After every step: no row processed twice; a row processed in the step carries a fence that
held its partition, not older than the partition's fence when the step began (a fenced-out
holder wrote nothing); a run that moved to `succeeded` left no row to do that was committed
before the round that ended it; no partition failed. At the end of each example everything is
driven to its end (bounded) and every row must be processed exactly once. The examples are
derandomized (CI runs the same ones); docs/decisions.md says why it is built this way.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter, defaultdict
from typing import Any, ClassVar

import pytest
import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from bench.cm_data import cm_data
from lease import Leases
from lease.keeper import Keeper
from tasks.ranges.controls import ControlRefused, Controls
from tasks.ranges.runner import Outcome, PartitionRunner
from tasks.ranges.tables import PartitionStatus as S
from tasks.ranges.tables import RunState
from tests.ranges import model_support as support

JOB = dataclasses.replace(cm_data, partition_size=20, batch_size=4, parallelism=1,
                          min_batch_size=1, target_batch_s=None)
TTL = 30.0  # holder_options' lease TTL: leases expire only when the model says
FINAL_ROUNDS = 10  # reconcile rounds the final drive may take before the run must succeed
MAX_HELD = 2  # holders paused at once
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "30"))
STEPS = int(os.environ.get("MODEL_STEPS", "30"))

# Turns of a holder's batch loop: a partition of 20 full rows takes 6 (5 batches and the
# keyset pass's empty read), so about half the draws run it to its end.
TURNS = st.one_of(st.integers(0, 8), st.just(100))


def has_parts(machine: RangeProtocol) -> bool:
    return bool(machine.work)


class RangeProtocol(RuleBasedStateMachine):
    """The model: what was inserted and when, the fences seen per partition, held holders."""

    env: ClassVar[support.Env]
    seen_counts: ClassVar[Counter[str]]

    def __init__(self) -> None:
        super().__init__()
        env = self.env
        support.reset(env.engine, env.client)
        self.clock = support.FakeClock()
        self.leases = Leases(env.client, clock=self.clock,
                             keeper=Keeper(env.client, clock=self.clock, threads=False))
        self.controls = Controls(env.sessions, env.client, lambda _job: {})
        self.held: list[support.Paused] = []
        self.names = 0
        self.busy = False
        self.work: dict[int, support.Work] = {}
        self.data: dict[int, support.Data] = {}
        self.run: tuple[int, str] | None = None
        self.fences: dict[int, set[int]] = defaultdict(set)

    # -- actions ------------------------------------------------------------------------------

    @initialize(rows=st.integers(0, 70), holes=st.sets(st.integers(1, 70), max_size=6))
    @support.step
    def seed(self, rows: int, holes: set[int]) -> None:
        """Ids 1..rows but the holes (deleted rows, ids burned by rollbacks), then `start`."""
        self._insert([i for i in range(1, rows + 1) if i not in holes])
        self.start()

    @rule()
    @support.step
    def start(self) -> None:
        support.start_run(self.env, self.controls, JOB)

    @rule()
    @support.step
    def reconcile(self) -> None:
        support.round_now(self.env, JOB)

    @precondition(has_parts)
    @rule(pick=st.integers(0, 20), turns=TURNS, adopt=st.booleans())
    @support.step
    def run_holder(self, pick: int, turns: int, adopt: bool) -> None:
        """A holder runs `turns` turns of its batch loop, then hands the partition back."""
        runner = self._runner(JOB, self._part(pick), support.Budget(turns), may_adopt=adopt)
        self._ran(runner, runner.run())
        if runner.adopted is not None:
            orphan = self._runner(JOB, runner.adopted, support.Budget(turns))
            self._ran(orphan, orphan.run())

    @precondition(has_parts)
    @rule(pick=st.integers(0, 20), turns=TURNS, inside=st.booleans())
    @support.step
    def crash_holder(self, pick: int, turns: int, inside: bool) -> None:
        """A holder dies after its claim and `turns` turns (inside the next batch's
        transaction, or between batches); its lease lapses, its row stays `running`."""
        if inside:
            runner = self._runner(support.crashing(JOB, turns), self._part(pick),
                                  support.Budget(10**6))
        else:
            runner = self._runner(JOB, self._part(pick), support.Budget(turns, crash=True))
        try:
            outcome = runner.run()
        except support.Crash:
            return
        self._ran(runner, outcome)

    @precondition(lambda self: has_parts(self) and len(self.held) < MAX_HELD)
    @rule(pick=st.integers(0, 20), turn=st.integers(1, 4), more=st.integers(0, 4),
          point=st.sampled_from([support.BEFORE_BATCH, support.AFTER_READ]))
    @support.step
    def pause_holder(self, pick: int, turn: int, more: int, point: str) -> None:
        """A holder stops (GC, SIGSTOP, network) at its `turn`-th batch; it is held there
        until `let_go`, then runs up to `more` more turns."""
        if self.env.kind == "sqlite":  # its batch holds the write lock from its read on
            point = support.BEFORE_BATCH
        part = self._part(pick)
        holder = support.Paused(self.env.engine, JOB, part, point, turn,
                                **self._options(support.Budget(turn + more)))
        holder.start()
        self.seen(f"pause {point}: {'parked' if holder.parked else 'ended first'}")
        if holder.parked:
            holder.fence = support.work_rows(self.env.engine)[part].fence
            self.held.append(holder)
        else:
            self._ended(holder)

    @precondition(lambda self: bool(self.held))
    @rule(pick=st.integers(0, 20))
    @support.step
    def let_go(self, pick: int) -> None:
        holder = self.held.pop(pick % len(self.held))
        holder.release()
        self._ended(holder)

    @precondition(has_parts)
    @rule()
    @support.step
    def ttl_passes(self) -> None:
        """A lease TTL passes with no renewal: every lease expires in Redis and past its
        holder's safe-until."""
        support.expire(self.env.client, JOB, sorted(self.work))
        self.clock.advance(TTL + 1)

    @precondition(lambda self: bool(self.held))
    @rule(pick=st.integers(0, 20))
    @support.step
    def lose_lease(self, pick: int) -> None:
        """One held holder's lease is gone from Redis (a failover); its holder is not told."""
        support.expire(self.env.client, JOB, [self.held[pick % len(self.held)].part])

    @rule()
    @support.step
    def redis_restarts_empty(self) -> None:
        self.env.client.flushdb()

    # resume twice as often as pause: a paused run stops every holder
    @rule(verb=st.sampled_from(["pause", "resume", "resume", "cancel", "throttle",
                                "unthrottle"]))
    @support.step
    def control(self, verb: str) -> None:
        try:
            if verb == "throttle":  # a cap no batch here reaches: the gate, without waits
                self.controls.throttle(JOB.name, 1e6, "model")
            elif verb == "unthrottle":
                self.controls.throttle(JOB.name, 0, "model")
            else:
                getattr(self.controls, verb)(JOB.name, "model")
        except ControlRefused:
            pass

    @rule(where=st.sampled_from(["below-checkpoint", "above-max", "anywhere"]),
          pick=st.integers(0, 20), offset=st.integers(0, 105))
    @support.step
    def insert(self, where: str, pick: int, offset: int) -> None:
        """A row commits with an explicit id: below a partition's checkpoint (an id allocated
        early: a cached sequence, an id block, an application id), above the table's max, or
        anywhere from -5 (below the first partition) to 100."""
        if where == "above-max":
            self._insert([max(self.data, default=0) + 1 + offset % 25])
        elif where == "anywhere":
            self._insert([offset - 5] if offset - 5 not in self.data else [])
        else:
            started = [w for _, w in sorted(self.work.items()) if w.next_id > w.lo]
            for at in range(len(started)):
                w = started[(pick + at) % len(started)]
                free = [i for i in range(w.lo, min(w.next_id, w.hi + 1)) if i not in self.data]
                if free:
                    self._insert([free[offset % len(free)]])
                    return

    @precondition(lambda self: bool(self.data))
    @rule(tail=st.booleans(), pick=st.integers(0, 200), count=st.integers(1, 3))
    @support.step
    def delete(self, tail: bool, pick: int, count: int) -> None:
        """Rows are deleted: the highest ids of a partition (or ids burned by rollbacks), or
        any row."""
        if tail and self.work:
            w = self.work[self._part(pick)]
            self._delete(sorted(i for i in self.data if w.lo <= i <= w.hi)[-count:])
        else:
            self._delete([sorted(self.data)[pick % len(self.data)]])

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    @support.step
    def protocol_holds(self) -> None:
        engine = self.env.engine
        data, work = support.data_rows(engine), support.work_rows(engine)
        run = support.run_state(engine)
        failed = {p: w.error for p, w in work.items() if w.status == S.FAILED}
        assert not failed, f"partitions failed: {failed}"
        twice = sorted(i for i, d in data.items() if d.count > 1)
        assert not twice, f"rows processed more than once: {twice[:20]}"
        for part, w in work.items():
            self.fences[part].add(w.fence)
        for held in self.held:
            if held.fence is not None:
                self.fences[held.part].add(held.fence)
        for row in data.values():
            was = self.data.get(row.id)
            if row.count == 1 and (was is None or was.count == 0):
                support.check_fence(row, work, self.work, self.fences)
        if run != self.run and run is not None and run[1] == RunState.SUCCEEDED:
            left = sorted(i for i, d in data.items() if d.status == 0 and i in self.data)
            assert not left, (f"run {run[0]} succeeded, but rows committed before the round "
                              f"that ended it are still to do: {left[:20]}")
        if run != self.run and run is not None:
            self.seen(f"run: {run[1]}")
        self.data, self.work, self.run = data, work, run

    # -- the end ------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            failed = self.busy
            held, self.held = self.held, []
            for holder in held:
                holder.release()
                if not failed:
                    self._ended(holder)
            if not failed:
                self.protocol_holds()
                self._drive_to_end()
        finally:
            self.leases.close()

    def _drive_to_end(self) -> None:
        """Everything to its end: every row must be processed exactly once."""
        support.expire(self.env.client, JOB, sorted(self.work))
        self.clock.advance(TTL + 1)
        for _ in range(FINAL_ROUNDS):
            state = support.run_state(self.env.engine)
            left = [i for i, d in self.data.items() if d.status == 0]
            if state is not None and state[1] == RunState.SUCCEEDED and not left:
                break
            if state is None or state[1] in RunState.ENDED:
                self.start()
            elif state[1] == RunState.PAUSED:
                self.control("resume")
            self.reconcile()
            self.protocol_holds()
            for part, w in sorted(self.work.items()):
                if w.status in (S.PENDING, S.RUNNING):
                    runner = self._runner(JOB, part, support.Budget(10**6))
                    self._ran(runner, runner.run())
                    self.protocol_holds()
        else:
            statuses = {p: (w.status, w.next_id) for p, w in sorted(self.work.items())}
            left = sorted(i for i, d in self.data.items() if not d.count)
            raise AssertionError(f"the run did not succeed within {FINAL_ROUNDS} rounds: run "
                                 f"{support.run_state(self.env.engine)}, partitions {statuses}, "
                                 f"rows to do {left}")
        counts = {i: d.count for i, d in self.data.items() if d.count != 1}
        assert not counts, f"rows not processed exactly once at the end: {counts}"

    # -- helpers ------------------------------------------------------------------------------

    def seen(self, what: str) -> None:
        """Count what happened, so the test can show it explored what it claims to."""
        self.seen_counts[what] += 1

    def _part(self, pick: int) -> int:
        """A planned partition; a low `pick` prefers one a held holder has (a takeover)."""
        if self.held and pick < 5:
            return self.held[pick % len(self.held)].part
        parts = sorted(self.work)
        return parts[pick % len(parts)]

    def _options(self, budget: support.Budget, **more: Any) -> dict[str, Any]:
        self.names += 1
        return support.holder_options(self.env, self.leases, self.clock, budget,
                                      f"holder-{self.names}", **more)

    def _runner(self, job: Any, part: int, budget: support.Budget, **more: Any) -> PartitionRunner:
        return PartitionRunner(job, part, **self._options(budget, **more))

    def _ran(self, runner: PartitionRunner, outcome: str) -> None:
        self.seen(f"holder: {outcome}")
        assert outcome != Outcome.FAILED, (
            f"part {runner.part} failed: {support.work_rows(self.env.engine)[runner.part].error}")

    def _ended(self, holder: support.Paused) -> None:
        if holder.error is not None:
            raise holder.error
        assert holder.outcome is not None
        self._ran(holder.runner, holder.outcome)

    def _insert(self, ids: list[int]) -> None:
        support.insert_rows(self.env.engine, ids)
        self.data.update({i: support.Data(i, 0, 0, 0) for i in ids})

    def _delete(self, ids: list[int]) -> None:
        support.delete_rows(self.env.engine, ids)
        for i in ids:
            self.data.pop(i, None)


# A passing run takes well under the suite's 120 s; a failing one shrinks its example for up
# to five minutes (hypothesis' own bound) before it reports it. Longer runs get longer.
@pytest.mark.timeout(600 * max(1, EXAMPLES * STEPS // 900))
@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"], indirect=True)
def test_the_range_protocol_keeps_its_invariants_under_random_steps(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis, db_kind: str
) -> None:
    support.watch_reads(engine)
    machine = type(f"RangeProtocolOn{db_kind.title()}", (RangeProtocol,),
                   {"env": support.Env(engine, sessions, redis_client, db_kind),
                    "seen_counts": Counter()})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True,
        database=None, suppress_health_check=list(HealthCheck), print_blob=False,
        # no explain phase: it traces every line of a failing example, minutes here
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]))
    print(dict(sorted(machine.seen_counts.items())))
    support.assert_reached(machine.seen_counts, after_read=db_kind != "sqlite")


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
def test_a_holder_of_a_cancelled_run_is_fenced_out_of_its_replanned_partition(
    engine: Engine, sessions: sessionmaker[Session], redis_client: redis.Redis
) -> None:
    """A holds partition 0 with fence 1 and is paused with its batch read (rows 1..4). The run
    is cancelled and started again (the partitions are planned anew), Redis restarts empty, B
    takes partition 0, processes rows 1..4 and dies. A wakes up: its batch must be refused."""
    env = support.Env(engine, sessions, redis_client, "postgresql")
    support.watch_reads(engine)
    clock = support.FakeClock()
    leases = Leases(redis_client, clock=clock,
                    keeper=Keeper(redis_client, clock=clock, threads=False))
    controls = Controls(sessions, redis_client, lambda _job: {})
    support.insert_rows(engine, list(range(1, 21)))
    assert support.start_run(env, controls, JOB)
    a = support.Paused(engine, JOB, 0, support.AFTER_READ, 1,
                       **support.holder_options(env, leases, clock, support.Budget(1), "A"))
    a.start()
    assert a.parked and support.work_rows(engine)[0].fence == 1
    controls.cancel(JOB.name, "test")
    assert support.start_run(env, controls, JOB)
    redis_client.flushdb()
    b = PartitionRunner(JOB, 0, **support.holder_options(
        env, leases, clock, support.Budget(1, crash=True), "B"))
    with pytest.raises(support.Crash):
        b.run()
    a.release()
    counts = {i: d.count for i, d in support.data_rows(engine).items() if d.count}
    assert counts == dict.fromkeys(range(1, 5), 1), f"processed twice: {counts}"
    assert a.outcome == Outcome.FENCED_OUT
