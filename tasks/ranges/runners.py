"""How many runner messages of a range job are outstanding (pull-based scheduling).

A runner message (`tasks.ranges.run_partition` with a runner token) means "run partitions of
job J": its task claims the job's next pending partition itself (`tasks.ranges.claims`), runs
it, and claims again until none is left (`tasks.ranges.pull`). The reconciler sends one only
while fewer than the job's bound (RANGE_RUNNERS) are outstanding, so the messages in flight
follow the fleet, not the backlog. Outstanding means: the token is in the job's sorted set
(`range-runners:{JOB}`) with a score still in the future, on the Redis server's clock:

    sent       the reconciler adds the token, counted for `wait` seconds (RANGE_RUNNER_WAIT:
               a message the broker lost is replaced after that long)
    held       a worker received the message: its main process marks the token for `alive`
               seconds, again every LEASE_TTL / 2 while the request is its own
               (`tasks.ranges.keeper`), and once more if the task failed. A message lost with
               its worker (kill -9 with the message prefetched, a task failed before its body
               ran) stops counting `alive` seconds later, not `wait` seconds
    running    the task marks its token for `alive` seconds at its start, at each partition
               it claims and at its batches' progress (a runner that died stops counting soon
               after; its partition is taken over through its lease like any holder's)
    handed on  at the end of its time slice or at a warm shutdown the task sends its own
               continuation with the same token, counted for `wait` seconds again
    ended      nothing left to claim, or the job paused: the token is removed

A task whose token no longer counts (it waited longer than `wait`) runs only if the job has
room for it; otherwise it ends at once, so a late message never raises the count above the
bound. Tokens are random hex, made here.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from lease.scripts import load_lua, ms, run_script
from tasks.ranges.keys import range_runners_key
from tasks.store.validate import InvalidArguments, quote

__all__ = ["RunnerSlots", "new_token", "validate_token"]

COUNT = load_lua(__package__, "runners_count")
MARK = load_lua(__package__, "runners_mark")
HELD = load_lua(__package__, "runners_held")


_TOKEN = re.compile(r"[0-9a-f]{1,32}")


def new_token() -> str:
    return secrets.token_hex(8)


def validate_token(token: object) -> str:
    """A runner token from a message: hex, at most 32 characters."""
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise InvalidArguments(f"runner must be a runner token (hex), got {quote(token)}")
    return token


class RunnerSlots:
    """The outstanding runner messages of `job` on `client`, at most `bound` of them."""

    def __init__(self, client: Any, job: str, bound: int, *, wait: float,
                 alive: float) -> None:
        self.client, self.job, self.bound = client, job, bound
        self.wait, self.alive = wait, alive
        self.key = range_runners_key(job)
        self._count = client.register_script(COUNT)
        self._mark = client.register_script(MARK)
        self._held = client.register_script(HELD)

    def outstanding(self) -> int:
        """How many runner messages of the job count now (expired ones are dropped)."""
        return int(run_script(self.client, self._count, [self.key], []))

    def sent(self, tokens: list[str]) -> None:
        """The reconciler sends messages with `tokens` (it counted the room for them), or a
        task hands its own token on to its continuation message."""
        if tokens:
            run_script(self.client, self._mark, [self.key], [ms(self.wait), 0, *tokens])

    def running(self, token: str) -> bool:
        """The task of `token` runs (or goes on): it counts for `alive` seconds more. False if
        its token no longer counted and the job has no room for it: the task ends."""
        return bool(run_script(self.client, self._mark, [self.key],
                               [ms(self.alive), self.bound, token]))

    def held(self, tokens: list[str]) -> int:
        """A worker holds the messages of `tokens`: those that still count, count for `alive`
        seconds from now (never more than that, never again once ended). Returns how many."""
        if not tokens:
            return 0
        return int(run_script(self.client, self._held, [self.key], [ms(self.alive), *tokens]))

    def ended(self, token: str) -> None:
        self.client.zrem(self.key, token)
