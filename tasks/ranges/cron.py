"""Cron schedules of range jobs, as pure logic: the expression, the policies, and which due
times a tick at `now` owes (the database side is `tasks.ranges.timetable`).

    RangeJob(..., schedule="0 2 * * *")            every night at 02:00 UTC
    RangeJob(..., schedule="*/10 * * * * *")       every 10 seconds (a sixth field, first,
                                                   is the second: Quartz's order)

Expressions are croniter's (five fields, or six with seconds first; `@daily`, `@hourly` ...),
always in UTC. The concurrency policy says what a due time does while a run of the job is
live; the missed policy what a tick does with due times that passed while no beat ran:

    skip      (default) the due time is skipped, recorded as a skipped fire
    replace   the live run is cancelled and a new one starts
    queue     one run starts when the live run ends (at most one waits; another due time
              meanwhile is skipped)

    once      (default) due times missed by more than the grace start one run, now
    skip      they are skipped; the next due time on time fires as usual

A tick that finds several due times past (a beat down for an hour) fires at most one run, for
the latest; the earlier ones are counted in its record (`Due.covers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from tasks.config.clock import iso
from tasks.store.validate import InvalidArguments, quote

__all__ = ["POLICIES", "MISSED", "Cron", "Due", "InvalidSchedule", "parse_cron",
           "validate_policy", "validate_missed", "due_at", "MAX_COVERED"]

POLICIES = ("skip", "replace", "queue")
MISSED = ("once", "skip")
MAX_CRON_LEN = 128
MAX_COVERED = 10_000  # due times a tick counts past (a cron every second, down three hours)


class InvalidSchedule(InvalidArguments):
    """A cron expression or policy that cannot be used; nothing was stored."""


@dataclass(frozen=True)
class Cron:
    """A checked cron expression (UTC)."""

    expr: str

    def after(self, when: datetime) -> datetime:
        """The first due time strictly after `when`."""
        found: datetime = croniter(self.expr, when, second_at_beginning=True).get_next(datetime)
        return found

    def before(self, when: datetime) -> datetime:
        """The last due time at or before `when`."""
        probe = when + timedelta(seconds=1)
        found: datetime = croniter(self.expr, probe, second_at_beginning=True).get_prev(datetime)
        return found

    def passed(self, first: datetime, now: datetime) -> tuple[datetime, int]:
        """The latest due time from `first` (itself one) up to `now`, and how many there
        are (counted up to MAX_COVERED)."""
        count, at, latest = 0, first, first
        while at <= now and count < MAX_COVERED:
            count, latest = count + 1, at
            at = self.after(at)
        if at <= now:  # more than MAX_COVERED passed: stop counting, find the latest
            latest = self.before(now)
        return latest, count


def parse_cron(expr: object) -> Cron:
    """`expr` as a `Cron`; `InvalidSchedule` with a one-line reason otherwise."""
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidSchedule(f"schedule must be a cron expression, got {quote(expr)}")
    text = " ".join(expr.split())
    if len(text) > MAX_CRON_LEN:
        raise InvalidSchedule(f"schedule {quote(text)} is longer than {MAX_CRON_LEN} characters")
    fields = len(text.split())
    if not text.startswith("@") and fields not in (5, 6):
        raise InvalidSchedule(f"schedule {quote(text)}: a cron expression has 5 fields "
                              "(minute hour day month weekday) or 6 (second first)")
    try:
        croniter(text, datetime(2026, 1, 1), second_at_beginning=True).get_next(datetime)
    except (CroniterBadCronError, CroniterBadDateError, ValueError, KeyError) as exc:
        raise InvalidSchedule(f"schedule {quote(text)} is not a valid cron expression: "
                              f"{' '.join(str(exc).split())[:160]}") from None
    return Cron(text)


def validate_policy(policy: object) -> str:
    if policy not in POLICIES:
        raise InvalidSchedule(f"schedule policy must be one of {', '.join(POLICIES)}, "
                              f"got {quote(policy)}")
    assert isinstance(policy, str)
    return policy


def validate_missed(missed: object) -> str:
    if missed not in MISSED:
        raise InvalidSchedule(f"missed-run policy must be one of {', '.join(MISSED)}, "
                              f"got {quote(missed)}")
    assert isinstance(missed, str)
    return missed


@dataclass(frozen=True)
class Due:
    """What a tick at `now` owes a schedule whose next due time was `first`."""

    at: datetime  # the latest due time passed (the one a run would be started for)
    covers: int  # due times passed in all (1: just `at`)
    late: bool  # `at` passed longer ago than the grace: the beat was down across it
    next_at: datetime  # the next due time after now

    def detail(self) -> str:
        text = f"due {iso(self.at)}"
        if self.covers > 1:
            text += f", covering {self.covers - 1} earlier due times"
        return text + (" (missed)" if self.late else "")


def due_at(cron: Cron, first: datetime, now: datetime, grace: float) -> Due | None:
    """The due times from `first` up to `now` as one `Due`, or None if `first` is later."""
    if first > now:
        return None
    latest, count = cron.passed(first, now)
    return Due(latest, count, now - latest > timedelta(seconds=grace), cron.after(now))

