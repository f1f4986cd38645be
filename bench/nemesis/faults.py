"""The nemesis: a fault schedule drawn from `random.Random(seed)` before the run, then applied.

`schedule(seed, duration, ttl)` is a pure function of its arguments: the same seed gives the
same faults, in the same order, at the same offsets, on the same targets (a target is an index
into the sorted worker names, or a row range). `Nemesis.apply` runs each fault in a thread of
its own (a fault that holds something, a SIGSTOP or a lock, undoes itself after its hold) and
logs it with its time, for the checker to name the fault that preceded a failure.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import Engine, text

from bench.faultproxy import FaultProxy
from bench.nemesis.fleet import ROOT, RedisProc, Supervisor, pool_children
from bench.nemesis.job import JOB
from tasks.examples.saga import SAGA_PREFIX

__all__ = ["Fault", "schedule", "Nemesis", "KINDS"]

# The kinds of fault. The schedule deals them from a deck shuffled anew each round, so every
# kind lands once per len(KINDS) faults: a short run still meets each of them.
KINDS = (
    "kill_worker", "kill_pool", "sigstop", "kill_leader_beat", "redis_restart", "flushall",
    "proxy_latency", "proxy_cut", "proxy_blackhole", "db_row_lock", "db_table_lock",
    "control_storm",
)
VERBS = ("pause", "resume", "throttle", "cancel", "start")
WARMUP_S = 3.0
# The saga ledgers, read atomically before a wipe. KEYS: none (it lists saga:* on the run's
# private Redis, whose every ledger it must take: the one place a KEYS scan is the point).
# ARGV[1]: "1" to FLUSHALL in the same step (no entry falls in between), "0" to only read (run
# with EVAL_RO under CLIENT PAUSE WRITE before a restart). Returns [key, [entries], ...].
SNAPSHOT = """
local out = {}
for _, key in ipairs(redis.call('KEYS', 'saga:*')) do
  out[#out + 1] = key
  out[#out + 1] = redis.call('LRANGE', key, 0, -1)
end
if ARGV[1] == '1' then redis.call('FLUSHALL') end
return out
"""


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the faults began
    kind: str
    target: int  # an index (a worker, a pool process, the first row of a lock); kind-specific
    hold: float  # seconds a held fault lasts (0: instant)
    verbs: tuple[str, ...] = ()  # control_storm: the verbs, in order


def _draw(rng: random.Random, kind: str, at: float, ttl: float) -> Fault:
    target = rng.randrange(1 << 16)
    hold = {
        "sigstop": ttl * rng.uniform(1.5, 2.5), "proxy_latency": rng.uniform(2, 5),
        "proxy_blackhole": ttl * rng.uniform(1.5, 3), "db_row_lock": rng.uniform(2, 5),
        "db_table_lock": rng.uniform(2, 4),
    }.get(kind, 0.0)
    verbs: tuple[str, ...] = ()
    if kind == "control_storm":
        verbs = tuple(rng.choice(VERBS) for _ in range(rng.randint(3, 6)))
    return Fault(round(at, 3), kind, target, round(hold, 3), verbs)


def schedule(seed: int, duration: float, ttl: float) -> list[Fault]:
    """The run's faults: one every 2-5 s from WARMUP_S until `duration`."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    deck: list[str] = []
    at = WARMUP_S
    while at < duration:
        if not deck:
            deck = list(KINDS)
            rng.shuffle(deck)
        faults.append(_draw(rng, deck.pop(), at, ttl))
        at += rng.uniform(2.0, 5.0)
    return faults


@dataclass
class Nemesis:
    """Applies a schedule to the run's processes, Redis, proxy and database."""

    supervisor: Supervisor
    redis_proc: RedisProc
    proxy: FaultProxy
    engine: Engine
    env: dict[str, str]
    base_rate: float
    client: Any  # the application's Celery client: control tasks go through it
    log: list[tuple[float, str, str]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)  # faults that could not land
    wipes: list[float] = field(default_factory=list)  # when Redis lost everything (monotonic)
    ledgers: dict[str, list[str]] = field(default_factory=dict)  # saga ledgers wipes took
    began: float = 0.0
    _threads: list[threading.Thread] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self, faults: list[Fault], began: float) -> None:
        """Apply every fault at its offset from `began` (monotonic; the load's origin too, so
        the checker can say which fault came before what); returns after the last began."""
        self.began = began
        for fault in faults:
            if self._stop.wait(max(self.began + fault.at - time.monotonic(), 0)):
                return
            thread = threading.Thread(target=self._apply, args=(fault,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Apply no more faults (those holding something still undo themselves)."""
        self._stop.set()

    def wait(self) -> None:
        """Wait for every held fault to undo itself."""
        for thread in self._threads:
            thread.join(120)

    def note(self, kind: str, detail: str, at: float) -> None:
        """Log a fault as of `at` (monotonic), when it began."""
        self.log.append((round(at - self.began, 2), kind, detail))
        self.log.sort()
        print(f"  t={at - self.began:6.1f}s {kind}: {detail}", flush=True)

    def _apply(self, fault: Fault) -> None:
        at = time.monotonic()
        try:
            detail = getattr(self, f"_{fault.kind}")(fault)
        except Exception as exc:  # noqa: BLE001 - a fault that could not land is logged
            detail = f"did not land: {type(exc).__name__}: {exc}"[:200]
            self.missed[fault.kind] += 1
        self.counts[fault.kind] += 1
        self.note(fault.kind, detail, at)

    # processes ----------------------------------------------------------------------------

    def _workers(self) -> list[str]:
        return sorted(n for n, m in self.supervisor.members.items() if m.kind != "beat")

    def _kill_worker(self, fault: Fault) -> str:
        names = self._workers()
        name = names[fault.target % len(names)]
        landed = self.supervisor.kill_group(name, signal.SIGKILL)
        return f"kill -9 {name} (main and pool)" + ("" if landed else ": it was down")

    def _kill_pool(self, fault: Fault) -> str:
        names = self._workers()
        name = names[fault.target % len(names)]
        pid = self.supervisor.pid(name)
        children = pool_children(pid) if pid else []
        if not children:
            return f"{name} has no pool process now"
        child = children[(fault.target // len(names)) % len(children)]
        signal_pid(child, signal.SIGKILL)
        return f"kill -9 pool process {child} of {name}"

    def _sigstop(self, fault: Fault) -> str:
        names = self._workers()
        name = names[fault.target % len(names)]
        if not self.supervisor.kill_group(name, signal.SIGSTOP):
            return f"{name} was down"
        time.sleep(fault.hold)
        self.supervisor.kill_group(name, signal.SIGCONT)
        return f"SIGSTOP {name} for {fault.hold:.1f}s, then SIGCONT"

    def _kill_leader_beat(self, fault: Fault) -> str:
        beats = sorted(n for n, m in self.supervisor.members.items() if m.kind == "beat")
        leader = next((b for b in beats if is_leader(self.supervisor.log(b).read_text(
            errors="replace"))), None)
        if leader is None:
            leader = beats[fault.target % len(beats)]
            self.supervisor.kill_group(leader, signal.SIGKILL)
            return f"no beat says it leads; kill -9 {leader}"
        self.supervisor.kill_group(leader, signal.SIGKILL)
        return f"kill -9 the leader beat {leader}"

    # Redis --------------------------------------------------------------------------------

    def _redis_restart(self, fault: Fault) -> str:
        client = self._direct()
        try:
            # No client writes while the ledgers are read (a read-only script runs through a
            # WRITE pause; with ALL it would wait too); then the server dies.
            client.execute_command("CLIENT", "PAUSE", "10000", "WRITE")
            self._keep(client.eval_ro(SNAPSHOT, 0, 0))
            self.wipes.append(time.monotonic())
            self.redis_proc.restart_empty()
        finally:
            client.close()
        return "redis-server killed and restarted empty"

    def _flushall(self, fault: Fault) -> str:
        client = self._direct()
        try:
            self._keep(client.eval(SNAPSHOT, 0, 1))  # read and flushed in one script
            self.wipes.append(time.monotonic())
        finally:
            client.close()
        return "FLUSHALL"

    def _direct(self) -> redis.Redis:
        return redis.Redis(port=self.redis_proc.port, socket_timeout=10)

    def _keep(self, flat: list[Any]) -> None:
        """Keep the saga ledgers a wipe takes (the checker judges them whole)."""
        for key, entries in zip(flat[::2], flat[1::2], strict=True):
            order_id = key.decode().removeprefix(SAGA_PREFIX)
            self.ledgers.setdefault(order_id, []).extend(e.decode() for e in entries)

    def _proxy_latency(self, fault: Fault) -> str:
        delay = 0.05 + (fault.target % 250) / 1000
        self.proxy.latency(delay)
        time.sleep(fault.hold)
        self.proxy.latency(0.0)
        return f"{delay * 1000:.0f} ms each way for {fault.hold:.1f}s"

    def _proxy_cut(self, fault: Fault) -> str:
        return f"reset {self.proxy.cut()} connections"

    def _proxy_blackhole(self, fault: Fault) -> str:
        self.proxy.blackhole(True)
        time.sleep(fault.hold)
        self.proxy.blackhole(False)
        return f"black hole for {fault.hold:.1f}s, then its connections reset"

    # database -----------------------------------------------------------------------------

    def _db_row_lock(self, fault: Fault) -> str:
        with self.engine.begin() as conn:
            ids = conn.execute(text(
                "SELECT id FROM nemesis_rows ORDER BY id OFFSET (SELECT floor(:at * count(*)) "
                "FROM nemesis_rows) LIMIT 40 FOR UPDATE"),
                {"at": (fault.target % 1000) / 1000}).scalars().all()
            time.sleep(fault.hold)
        span = f"ids {ids[0]}..{ids[-1]}" if ids else "no rows"
        return f"SELECT ... FOR UPDATE on {len(ids)} rows ({span}) for {fault.hold:.1f}s"

    def _db_table_lock(self, fault: Fault) -> str:
        mode = "ACCESS EXCLUSIVE" if fault.target % 2 else "EXCLUSIVE"
        with self.engine.begin() as conn:
            conn.execute(text(f"LOCK TABLE nemesis_rows IN {mode} MODE"))
            time.sleep(fault.hold)
        return f"LOCK TABLE nemesis_rows IN {mode} MODE for {fault.hold:.1f}s"

    # controls -----------------------------------------------------------------------------

    def _control_storm(self, fault: Fault) -> str:
        """A burst of control tasks a few hundred ms apart (as `celery call` sends them), then
        the CLI leaves the job live: resumed, started if the burst ended its run, base rate."""
        said = []
        for i, verb in enumerate(fault.verbs):
            args: list[Any] = [JOB]
            if verb == "throttle":
                args.append(5 + (fault.target >> i) % 50)
            self.client.send_task(f"tasks.ranges.{verb}", args=args, ignore_result=True)
            said.append(" ".join(str(a) for a in [verb, *args[1:]]))
            time.sleep(0.1 + (fault.target >> (2 * i)) % 5 / 10)
        closing = [self.jobs("resume"), self.jobs("start"),
                   self.jobs("throttle", f"{self.base_rate:g}")]
        return f"tasks {', '.join(said)}; then CLI {'; '.join(closing)}"

    def jobs(self, verb: str, *args: str) -> str:
        """`python -m tasks jobs VERB nemesis_rows ARGS` as an operator types it."""
        done = subprocess.run([sys.executable, "-m", "tasks", "jobs", verb, JOB, *args],
                              env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        return f"{verb}{' ' + ' '.join(args) if args else ''} -> {done.returncode}"


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def is_leader(log_text: str) -> bool:
    """Whether a beat's log says it leads now: its last 'became leader' after its last start
    and its last 'lost the leader lease'."""
    became = log_text.rfind("became leader")
    return became > max(log_text.rfind("--- start"), log_text.rfind("lost the leader lease"))


def describe(faults: list[Fault]) -> dict[str, Any]:
    """How many faults of each kind a schedule holds."""
    return dict(Counter(f.kind for f in faults))
