"""Retry policies: schedules, jitter bounds, the retry decision and the start-up check."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded, TimeLimitExceeded
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.config.settings import SettingsError
from tasks.worker.retry import (
    EXPONENTIAL,
    FIBONACCI,
    RetryPolicy,
    base_delay,
    check_policy,
    countdown,
    decide,
    max_delay,
    preset,
)

# No example database: these tests write nothing to the working tree.
no_db = settings(database=None)


def fixed(value: float) -> Callable[[], float]:
    return lambda: value


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (EXPONENTIAL, [1, 2, 4, 8, 16, 32, 60, 60]),
        (FIBONACCI, [1, 1.618, 2.617924, 4.235801, 6.853526, 11.089005, 17.942010, 29.030174]),
    ],
    ids=["exponential", "fibonacci"],
)
def test_preset_schedules(policy: RetryPolicy, expected: list[float]) -> None:
    assert [base_delay(policy, n) for n in range(len(expected))] == pytest.approx(expected)


@pytest.mark.parametrize("attempt", [9, 100, 10_000, 10**9])
def test_fibonacci_and_huge_attempts_cap_at_max_interval(attempt: int) -> None:
    assert base_delay(FIBONACCI, attempt) == 60.0
    assert base_delay(EXPONENTIAL, attempt) == 60.0
    assert base_delay(RetryPolicy(multiplier=2), attempt) == 60.0


@pytest.mark.parametrize(("name", "policy"), [("exponential", EXPONENTIAL),
                                              ("Fibonacci ", FIBONACCI)])
def test_preset_lookup(name: str, policy: RetryPolicy) -> None:
    assert preset(name) is policy


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(SettingsError, match="'linear'.*exponential, fibonacci"):
        preset("linear")


@pytest.mark.parametrize(
    ("draw", "attempt", "expected"),
    [
        (0.0, 0, 0.5),
        (0.999999, 0, 1.5),
        (0.5, 0, 1.0),
        (0.0, 3, 4.0),
        (0.999999, 3, 12.0),
        (0.5, 3, 8.0),
        (0.0, 20, 30.0),
        (0.999999, 20, 90.0),
        (0.5, 20, 60.0),
    ],
)
def test_jitter_bounds(draw: float, attempt: int, expected: float) -> None:
    assert countdown(EXPONENTIAL, attempt, fixed(draw)) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("attempt", range(12))
def test_draw_of_one_half_is_exactly_the_base(attempt: int) -> None:
    for policy in (EXPONENTIAL, FIBONACCI, RetryPolicy(initial_interval=0.1, randomization=0.3)):
        assert countdown(policy, attempt, fixed(0.5)) == base_delay(policy, attempt)


def test_no_randomization_means_no_jitter() -> None:
    policy = RetryPolicy(randomization=0.0)
    assert {countdown(policy, 2, fixed(u)) for u in (0.0, 0.3, 0.999999)} == {4.0}


def test_a_rand_outside_its_range_is_still_clamped() -> None:
    assert countdown(EXPONENTIAL, 3, fixed(-5.0)) == 4.0
    assert countdown(EXPONENTIAL, 3, fixed(7.0)) == 12.0


@st.composite
def policies(draw: st.DrawFn, depth: int = 1) -> RetryPolicy:
    initial = draw(st.floats(0, 1e6, exclude_min=True))
    maximum = draw(st.floats(initial, 1e7))
    overrides: tuple[tuple[type[BaseException], RetryPolicy], ...] = ()
    if depth:
        children = draw(st.lists(policies(depth=depth - 1), max_size=2))
        overrides = tuple((OSError, child) for child in children)
    return RetryPolicy(
        max_retries=draw(st.integers(0, 20)),
        initial_interval=initial,
        max_interval=maximum,
        multiplier=draw(st.floats(1, 10)),
        randomization=draw(st.floats(0, 1, exclude_max=True)),
        overrides=overrides,
    )


draws = st.floats(0, 1, exclude_max=True)


@no_db
@given(policies(), st.integers(0, 10_000), draws)
def test_countdown_stays_within_its_bounds(policy: RetryPolicy, attempt: int, u: float) -> None:
    base = base_delay(policy, attempt)
    r = policy.randomization
    delay = countdown(policy, attempt, lambda: u)
    assert delay > 0
    assert math.isfinite(delay)
    assert base * (1 - r) <= delay <= policy.max_interval * (1 + r)
    assert delay <= base * (1 + r)
    assert delay <= max_delay(policy)


@no_db
@given(policies(), st.integers(0, 10_000), st.integers(0, 10_000))
def test_base_delay_is_non_decreasing(policy: RetryPolicy, a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert base_delay(policy, low) <= base_delay(policy, low + 1)
    assert policy.initial_interval <= base_delay(policy, low) <= base_delay(policy, high)
    assert base_delay(policy, high) <= policy.max_interval


@no_db
@given(policies(depth=2), st.integers(0, 30), draws)
def test_max_delay_covers_every_override(policy: RetryPolicy, retries: int, u: float) -> None:
    for exc in (OSError(), ValueError()):
        delay = decide(policy, exc, retries, lambda: u)
        assert delay is None or 0 < delay <= max_delay(policy)


def test_decide_retries_with_the_jittered_countdown() -> None:
    assert decide(EXPONENTIAL, ValueError(), 0, fixed(0.5)) == 1.0
    assert decide(EXPONENTIAL, ValueError(), 4, fixed(0.0)) == 8.0


@pytest.mark.parametrize(
    ("policy", "exc", "retries_done"),
    [
        (RetryPolicy(dont_retry_on=(ValueError,)), ValueError(), 0),
        (RetryPolicy(dont_retry_on=(LookupError,)), KeyError(), 0),
        (RetryPolicy(retry_on=(ConnectionError,)), ValueError(), 0),
        (RetryPolicy(max_retries=2), ValueError(), 2),
        (RetryPolicy(max_retries=0), ValueError(), 0),
        (RetryPolicy(retry_on=(Exception,)), SoftTimeLimitExceeded(), 0),
        (RetryPolicy(retry_on=(BaseException,)), TimeLimitExceeded(), 0),
        (RetryPolicy(retry_on=(BaseException,)), Retry(), 0),
        (RetryPolicy(retry_on=(BaseException,)), Reject(), 0),
        (RetryPolicy(retry_on=(BaseException,)), Ignore(), 0),
        (RetryPolicy(retry_on=(BaseException,)), KeyboardInterrupt(), 0),
        (RetryPolicy(retry_on=(BaseException,)), SystemExit(), 0),
        (RetryPolicy(overrides=((Exception, RetryPolicy()),)), SoftTimeLimitExceeded(), 0),
        (
            RetryPolicy(dont_retry_on=(PermissionError,), overrides=((OSError, RetryPolicy()),)),
            PermissionError(),
            0,
        ),
    ],
    ids=[
        "dont_retry_on",
        "dont_retry_on-subclass",
        "not-in-retry_on",
        "exhausted",
        "max_retries-0",
        "soft-time-limit",
        "time-limit",
        "celery-retry",
        "celery-reject",
        "celery-ignore",
        "keyboard-interrupt",
        "system-exit",
        "override-cannot-retry-soft-time-limit",
        "dont_retry_on-beats-override",
    ],
)
def test_decide_gives_up(policy: RetryPolicy, exc: BaseException, retries_done: int) -> None:
    assert decide(policy, exc, retries_done) is None


def test_override_supplies_its_own_policy() -> None:
    patient = RetryPolicy(max_retries=10, initial_interval=5.0, max_interval=300.0)
    policy = RetryPolicy(max_retries=2, overrides=((ConnectionError, patient),))
    assert decide(policy, ValueError(), 2) is None
    assert decide(policy, ConnectionRefusedError(), 2, fixed(0.5)) == 20.0
    assert decide(policy, ConnectionError(), 9, fixed(0.5)) == 300.0
    assert decide(policy, ConnectionError(), 10) is None


def test_first_matching_override_wins() -> None:
    first = RetryPolicy(max_retries=1)
    second = RetryPolicy(max_retries=9)
    policy = RetryPolicy(overrides=((OSError, first), (ConnectionError, second)))
    assert decide(policy, ConnectionError(), 1) is None
    policy = RetryPolicy(overrides=((ConnectionError, second), (OSError, first)))
    assert decide(policy, ConnectionError(), 1) is not None


def test_max_delay_includes_overrides() -> None:
    assert max_delay(EXPONENTIAL) == 90.0
    slow = RetryPolicy(max_interval=1000.0, randomization=0.1)
    assert max_delay(RetryPolicy(overrides=((OSError, slow),))) == pytest.approx(1100.0)


def test_check_policy_rejects_a_countdown_past_the_visibility_timeout() -> None:
    policy = RetryPolicy(max_interval=7000.0, randomization=0.5)
    with pytest.raises(SettingsError, match="'restock.fetch'.*10500.*7200"):
        check_policy(policy, 7200, "restock.fetch")


def test_check_policy_sees_an_override_past_the_visibility_timeout() -> None:
    policy = RetryPolicy(overrides=((OSError, RetryPolicy(max_interval=5000.0)),))
    with pytest.raises(SettingsError, match="'ranges.partition'"):
        check_policy(policy, 7200, "ranges.partition")


def test_check_policy_passes_the_default_policy() -> None:
    check_policy(RetryPolicy(), 7200, "restock.fetch")
    check_policy(FIBONACCI, 7200, "restock.fetch")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_retries": -1},
        {"max_retries": 1.5},
        {"max_retries": True},
        {"initial_interval": 0.0},
        {"initial_interval": -1.0},
        {"initial_interval": 61.0},
        {"initial_interval": math.nan},
        {"max_interval": math.inf},
        {"max_interval": 0.5},
        {"multiplier": 0.9},
        {"multiplier": math.nan},
        {"multiplier": math.inf},
        {"randomization": -0.1},
        {"randomization": 1.0},
        {"randomization": math.nan},
        {"retry_on": Exception},
        {"retry_on": (Exception, "ValueError")},
        {"dont_retry_on": (int,)},
        {"overrides": ((OSError, 3),)},
        {"overrides": ((3, RetryPolicy()),)},
        {"overrides": (OSError, RetryPolicy())},
    ],
    ids=repr,
)
def test_invalid_arguments_raise_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_negative_counts_raise_value_error() -> None:
    with pytest.raises(ValueError, match="attempt"):
        countdown(EXPONENTIAL, -1)
    with pytest.raises(ValueError, match="retries_done"):
        decide(EXPONENTIAL, ValueError(), -1)
