"""A runner task's loop (pull-based scheduling): run a partition, claim the next, repeat.

A runner message runs partitions of its job one after another within one time slice
(RANGE_SLICE, which stays below the soft time limit):

    next partition   an orphan first (a partition whose holder died, `range-orphans:{JOB}`,
                     whose lease nobody holds), else the lowest pending one, reserved by
                     the atomic claim (`tasks.ranges.claims`)
    run it           `PartitionRunner` as for any holder: lease, fenced claim of the work
                     row, batches; the time it may take is what is left of the slice
    then             finished, empty, failed, or someone else had it -> the next one;
                     adopted an orphan at a batch boundary -> the orphan next;
                     handed back (slice over, warm shutdown) -> the task sends its
                     continuation with that partition; paused, lease or database or
                     Redis away -> the loop ends (the reconciler tops runners up later)

Before each claim the loop asks `keep_going` (the runner's slot still counts, or the job
has room for it: `tasks.ranges.runners`); a runner with no room ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.exceptions import RedisError

from lease.keys import lease_key
from tasks.ranges.claims import claim_pending
from tasks.ranges.jobs import RangeJob
from tasks.ranges.keys import range_orphans_key
from tasks.ranges.outcomes import Outcome

__all__ = ["Pull", "Pulled", "GO_ON"]

log = logging.getLogger("tasks.ranges")

# Outcomes after which a runner claims its next partition; any other one ends its loop.
GO_ON = (Outcome.DONE, Outcome.EMPTY, Outcome.FINISHED, Outcome.BUSY, Outcome.STALE,
         Outcome.FAILED, Outcome.FENCED_OUT)
ORPHAN_TRIES = 3  # popped orphans someone already holds are dropped; this many at most


class Ran(Protocol):
    """What a partition run leaves behind (`PartitionRunner`)."""

    adopted: int | None

    @property
    def rows_done(self) -> int: ...


# Runs partition `part` within `seconds`; returns the runner and its outcome.
RunOne = Callable[[int, float], tuple[Ran, str]]


class ShutdownFlag(Protocol):
    def is_set(self) -> bool: ...


@dataclass
class Pulled:
    """What one runner task's loop did."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    handed_back: int | None = None  # the partition its continuation runs first
    more: bool = False  # the slice ended or the worker stops: send a continuation
    drained: bool = False  # nothing left to claim
    stopped: str | None = None  # the outcome that ended the loop (paused, an outage)


class Pull:
    """The loop of one runner task of `job`."""

    def __init__(self, job: RangeJob, sessions: Any, client: Any, *, run_one: RunOne,
                 hold: float, budget: float, shutdown: ShutdownFlag,
                 keep_going: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job, self.sessions, self.client = job, sessions, client
        self.run_one, self.hold, self.budget = run_one, hold, budget
        self.shutdown, self.keep_going, self.clock = shutdown, keep_going, clock

    def drive(self, first: int | None) -> Pulled:
        """Run `first` (if any), then claimed partitions until one of the loop's ends."""
        result = Pulled()
        deadline = self.clock() + self.budget
        part = first
        while True:
            if part is None:
                if self.shutdown.is_set() or self.clock() >= deadline:
                    result.more = True
                    return result
                part = self.next_part() if self.keep_going() else None
                if part is None:
                    result.drained = True
                    return result
            runner, outcome = self.run_one(part, max(deadline - self.clock(), 0.0))
            result.runs.append({"part": part, "outcome": outcome, "rows": runner.rows_done})
            if outcome == Outcome.YIELDED and runner.adopted is not None:
                part = runner.adopted
                continue
            if outcome == Outcome.HANDED_OVER:
                result.handed_back, result.more = part, True
                return result
            if outcome not in GO_ON:
                result.stopped = outcome
                return result
            part = None

    def next_part(self) -> int | None:
        """An orphan nobody holds, else the lowest pending partition (reserved); None if
        there is neither."""
        try:
            for _ in range(ORPHAN_TRIES):
                popped = self.client.spop(range_orphans_key(self.job.name))
                if popped is None:
                    break
                orphan = int(popped)
                if not self.client.exists(lease_key(self.job.lease_name(orphan))):
                    log.info("range %s: taking orphan part %s, whose holder died, before "
                             "any pending one", self.job.name, orphan)
                    return orphan
        except (RedisError, OSError):
            pass  # Redis is away: the pending claim's lease acquire reports it
        claimed = claim_pending(self.sessions, self.job.name, 1, hold=self.hold)
        return claimed[0] if claimed else None
