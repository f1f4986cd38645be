"""Retry policies: how long a failed task waits before its next attempt, and whether it gets one.

Pure functions over a frozen `RetryPolicy`, so a task calls them from its `except` block:

    delay = decide(POLICY, exc, self.request.retries)
    if delay is None:
        raise
    raise self.retry(exc=exc, countdown=delay, max_retries=None)

Jitter is +/- `randomization` around the exponential delay, never Celery's full jitter, which can
draw 0 and turn a backoff into a hot loop. `check_policy` runs at start-up: a countdown as long as
the Redis visibility timeout gets the waiting message redelivered, so the task runs twice.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded, TimeLimitExceeded

from tasks.config.settings import SettingsError

__all__ = [
    "EXPONENTIAL",
    "FIBONACCI",
    "NEVER_RETRIED",
    "RetryPolicy",
    "base_delay",
    "check_policy",
    "countdown",
    "decide",
    "max_delay",
    "preset",
]

# Control flow rather than failure: a time limit means the work is too big to finish in one run
# (retrying repeats the overrun), Retry/Reject/Ignore are Celery's own signals, and the last two
# are the process being told to stop. `retry_on=(Exception,)` must not swallow any of them.
NEVER_RETRIED: tuple[type[BaseException], ...] = (
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    Retry,
    Reject,
    Ignore,
    KeyboardInterrupt,
    SystemExit,
)


def _exception_classes(field: str, classes: object) -> None:
    if not isinstance(classes, tuple) or not all(
        isinstance(cls, type) and issubclass(cls, BaseException) for cls in classes
    ):
        raise ValueError(f"{field} must be a tuple of exception classes, got {classes!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """When and how often to retry. Times are in seconds; `attempt` 0 is the first retry.

    The delay before retry `n` is `initial_interval * multiplier**n`, capped at `max_interval`,
    then drawn uniformly from `[d*(1-randomization), d*(1+randomization)]`. The first entry of
    `overrides` whose class matches the exception supplies the whole policy used for it.
    """

    max_retries: int = 5
    initial_interval: float = 1.0
    max_interval: float = 60.0
    multiplier: float = 2.0
    randomization: float = 0.5
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dont_retry_on: tuple[type[BaseException], ...] = ()
    overrides: tuple[tuple[type[BaseException], RetryPolicy], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ValueError(f"max_retries must be an int, got {self.max_retries!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries ({self.max_retries}) must be >= 0")
        # `not (a < b)` rather than `a >= b`, so NaN fails every check; infinity would make an
        # unbounded countdown, which no visibility timeout can cover.
        if not (0 < self.initial_interval <= self.max_interval < math.inf):
            raise ValueError(
                f"need 0 < initial_interval ({self.initial_interval!r}) <= "
                f"max_interval ({self.max_interval!r}), both finite"
            )
        if not (1 <= self.multiplier < math.inf):
            raise ValueError(f"multiplier ({self.multiplier!r}) must be >= 1 and finite")
        if not (0 <= self.randomization < 1):
            raise ValueError(f"randomization ({self.randomization!r}) must be in [0, 1)")
        _exception_classes("retry_on", self.retry_on)
        _exception_classes("dont_retry_on", self.dont_retry_on)
        if not isinstance(self.overrides, tuple) or not all(
            isinstance(entry, tuple)
            and len(entry) == 2
            and isinstance(entry[1], RetryPolicy)
            for entry in self.overrides
        ):
            raise ValueError("overrides must be a tuple of (exception class, RetryPolicy) pairs")
        _exception_classes("overrides", tuple(cls for cls, _ in self.overrides))


EXPONENTIAL = RetryPolicy(multiplier=2.0)
# Successive delays grow by the golden ratio, as a Fibonacci sequence does.
FIBONACCI = RetryPolicy(multiplier=1.618)

_PRESETS = {"exponential": EXPONENTIAL, "fibonacci": FIBONACCI}


def preset(name: str) -> RetryPolicy:
    """Return the preset policy called `name` (case-insensitive); `SettingsError` if unknown."""
    try:
        return _PRESETS[name.strip().lower()]
    except KeyError:
        raise SettingsError(
            f"unknown retry policy preset {name!r}: expected one of {', '.join(_PRESETS)}"
        ) from None


def base_delay(policy: RetryPolicy, attempt: int) -> float:
    """Return the un-jittered delay before retry `attempt` (0 is the first retry)."""
    if attempt < 0:
        raise ValueError(f"attempt ({attempt}) must be >= 0")
    try:
        # float() so an int multiplier does not build a huge exact integer first.
        delay = policy.initial_interval * float(policy.multiplier) ** attempt
    except OverflowError:
        return policy.max_interval
    return min(policy.max_interval, delay)


def countdown(
    policy: RetryPolicy, attempt: int, rand: Callable[[], float] = random.random
) -> float:
    """Return the jittered delay before retry `attempt`, with `rand()` drawing from [0, 1).

    The result lies in `[base*(1-r), min(base*(1+r), max_interval*(1+r))]`, where `base` is
    `base_delay(policy, attempt)` and `r` is `policy.randomization`; `rand() == 0.5` gives `base`.
    """
    base = base_delay(policy, attempt)
    r = policy.randomization
    # base + offset rather than base * (1 - r + 2*r*u), so a draw of 0.5 gives `base` exactly.
    delay = base + base * r * (2.0 * rand() - 1.0)
    # The clamp keeps the bounds exact whatever rounding (or a misbehaving `rand`) did.
    delay = min(max(delay, base * (1 - r)), base * (1 + r), policy.max_interval * (1 + r))
    # A subnormal initial_interval can round the lower bound to 0; a zero countdown is a hot loop.
    return max(delay, math.ulp(0.0))


def max_delay(policy: RetryPolicy) -> float:
    """Return the largest countdown `policy` or any of its overrides can produce."""
    own = policy.max_interval * (1 + policy.randomization)
    return max([own, *(max_delay(override) for _, override in policy.overrides)])


def decide(
    policy: RetryPolicy,
    exc: BaseException,
    retries_done: int,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """Return the countdown before the next retry of a task that raised `exc`, or None.

    None means re-raise: `exc` is in `NEVER_RETRIED` or `dont_retry_on`, is not in `retry_on`,
    or `retries_done` has reached `max_retries`. `dont_retry_on` is checked before `overrides`,
    so "never retry" holds whatever an override says; a matching override then decides alone.
    """
    if retries_done < 0:
        raise ValueError(f"retries_done ({retries_done}) must be >= 0")
    if isinstance(exc, NEVER_RETRIED) or isinstance(exc, policy.dont_retry_on):
        return None
    for cls, override in policy.overrides:
        if isinstance(exc, cls):
            return decide(override, exc, retries_done, rand)
    if not isinstance(exc, policy.retry_on) or retries_done >= policy.max_retries:
        return None
    return countdown(policy, retries_done, rand)


def check_policy(policy: RetryPolicy, visibility_timeout: float, name: str) -> None:
    """Raise `SettingsError` naming task `name` if a countdown can reach `visibility_timeout`.

    Redis redelivers a message not acknowledged within the visibility timeout, and a message
    waiting out its countdown is not acknowledged: it would run twice.
    """
    longest = max_delay(policy)
    if longest >= visibility_timeout:
        raise SettingsError(
            f"task {name!r}: retry countdown can reach {longest:g}s, which must be below "
            f"VISIBILITY_TIMEOUT ({visibility_timeout:g}), or the waiting message is redelivered"
        )
