"""How every time is written, in one zone (UTC) with the zone named: ISO 8601 with a "Z" for
JSON (`iso`), and "2026-12-07 04:47:39 UTC" for tables and pages (`shown`). Stored times are
naive UTC (the database's CURRENT_TIMESTAMP and `datetime.utcnow` equivalents); an aware time is
converted to UTC first, so no caller ever prints a local time or a time without its zone."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["iso", "shown", "utc"]


def utc(when: datetime | float) -> datetime:
    """`when` (a naive UTC datetime, an aware one or a Unix time) as a naive UTC datetime."""
    if isinstance(when, (int, float)):
        return datetime.fromtimestamp(when, UTC).replace(tzinfo=None)
    if when.tzinfo is not None:
        return when.astimezone(UTC).replace(tzinfo=None)
    return when


def iso(when: datetime | float | None, timespec: str = "seconds") -> str | None:
    """ISO 8601 with its zone ("2026-12-07T04:47:39Z"); None stays None."""
    if when is None:
        return None
    return utc(when).isoformat(timespec=timespec) + "Z"


def shown(when: datetime | float | None, missing: str = "-") -> str:
    """For people: "2026-12-07 04:47:39 UTC" (`missing` for no time)."""
    if when is None:
        return missing
    return f"{utc(when):%Y-%m-%d %H:%M:%S} UTC"
