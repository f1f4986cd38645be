"""Before each batch of a partition run: the job's controls (pause, cancel) and its throttles.

One round trip per batch: ``lua/gate.lua`` reads the job's control hash
(`tasks.ranges.keys.range_control_key`: `state`, `rate`) and, while the job is throttled, reserves
the batch's rows from one GCRA arrival time shared by every partition on every worker, so all of
them together stay under the cap. The script answers how long to wait; the runner waits in
slices shorter than a third of the lease TTL, heartbeating its lease (a throttled holder is
alive and keeps its partition) and re-reading the controls, so a pause or `throttle JOB 0`
during a long wait takes effect within a slice.

A reservation is the size of the previous batch (the job's `batch_size` for the first); the
next call adds or takes back the difference once the batch's real size is known, so
closing reads that find nothing and short last batches cost nothing.

A job's `throttle_on` (e.g. replication lag above a bound) is asked before each batch too: while
it returns something truthy the run waits, 0.5 s, then twice as long each time up to
`BACKOFF_CAP`.

Adoption: a gate that `may_adopt` also pops, in the same call, one of the job's orphans (a
partition whose holder died, which the reconciler dispatched again: `range-orphans:{JOB}`).
`before_batch` then answers `ADOPT` with the partition in `adopted`; the runner hands its own
partition back at this boundary and its task runs the orphan next, so a taken-over partition
does not wait behind the fresh partitions queued when every worker is busy (an orphan whose
lease someone already holds is dropped, not adopted). A gate told its
`part` takes it off the orphans in its first call: whoever claimed it, it is nobody's orphan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from lease import Lease
from lease.keys import lease_key
from lease.scripts import load_lua, run_script
from tasks.ranges.jobs import RangeJob
from tasks.ranges.keys import range_control_key, range_orphans_key, range_throttle_key

__all__ = ["Gate", "GATE", "BACKOFF_FIRST", "BACKOFF_CAP", "NOTE_AFTER", "ADOPT"]

log = logging.getLogger("tasks.ranges")

GATE = load_lua(__package__, "gate")
BACKOFF_FIRST = 0.5  # seconds: the first wait while `throttle_on` says so
BACKOFF_CAP = 30.0  # seconds: the longest
NOTE_AFTER = 0.5  # a wait at least this long is written to the work row (status shows it)
ADOPT = "adopt"  # what `before_batch` answers when it adopted an orphan (in `Gate.adopted`)

# Told the length of a wait that is about to begin (seconds).
Note = Callable[[float], None]


class Gate:
    """The controls and throttles of `job` as one partition run sees them."""

    def __init__(self, client: Any, job: RangeJob, lease_ttl: float, *,
                 note: Note | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, may_adopt: bool = False,
                 part: int | None = None) -> None:
        self.client, self.job = client, job
        self.keys = [range_control_key(job.name), range_throttle_key(job.name),
                     range_orphans_key(job.name)]
        self.may_adopt = may_adopt
        self.adopted: int | None = None
        # The caller's partition, taken off the orphans by the first call (it is claimed).
        self._claimed = "" if part is None else str(part)
        self.slice = lease_ttl / 4
        self.note = note or (lambda _seconds: None)
        self.sleep, self.clock = sleep, clock
        self._script = client.register_script(GATE)
        self._reserved = 0

    def before_batch(self, lease: Lease, last_rows: int) -> str | None:
        """Wait as the job's throttles say; None to go on, or what stops the run: the control
        (`paused`, `cancelled`) or `ADOPT` (an orphan to run instead, in `adopted`).
        `last_rows` is what the previous batch processed."""
        expected = last_rows if last_rows > 0 else int(getattr(self.job, "batch_size", 1))
        state, wait_ms, reserved, orphan = run_script(
            self.client, self._script, self.keys,
            [expected, last_rows - self._reserved, "1" if self.may_adopt else "0",
             self._claimed])
        self._reserved, self._claimed = int(reserved), ""
        if state:
            return _text(state)
        if orphan and not self._held(int(orphan)):
            self.adopted = int(orphan)
            return ADOPT
        if wait_ms > 0:
            stop = self._wait(lease, wait_ms / 1000, throttled=True)
            if stop:
                return stop
        throttle_on = getattr(self.job, "throttle_on", None)
        return self._hold(lease, throttle_on) if throttle_on is not None else None

    def _held(self, orphan: int) -> bool:
        """Whether someone holds the popped orphan's lease already (its message reached a
        free worker first): then adopting it would hand this partition back for nothing."""
        return bool(self.client.exists(lease_key(self.job.lease_name(orphan))))

    def _hold(self, lease: Lease, throttle_on: Callable[[RangeJob], object]) -> str | None:
        """Wait while `throttle_on(job)` is truthy, backing off up to BACKOFF_CAP."""
        delay = BACKOFF_FIRST
        while reason := throttle_on(self.job):
            log.info("range %s: throttle_on says wait (%s); next check in %.1fs",
                     self.job.name, str(reason)[:100], delay)
            stop = self._wait(lease, delay, throttled=False)
            if stop:
                return stop
            delay = min(delay * 2, BACKOFF_CAP)
        return None

    def _wait(self, lease: Lease, seconds: float, *, throttled: bool) -> str | None:
        """Sleep `seconds` in slices, heartbeating the lease; stop early for a control (or,
        for a rate wait, when the rate was lifted)."""
        if seconds >= NOTE_AFTER:
            self.note(seconds)
        deadline = self.clock() + seconds
        while (left := deadline - self.clock()) > 0:
            self.sleep(min(left, self.slice))
            lease.check()
            lease.heartbeat()
            if self.clock() < deadline or not throttled:
                state, rate = self.client.hmget(self.keys[0], "state", "rate")
                if state:
                    return _text(state)
                if throttled and not float(rate or 0):
                    return None
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
