"""Every time the console's JSON API writes, in one zone with the zone named.

The wings' views write their times as ISO 8601, some with a "Z" and some naive (naive UTC, as
they are stored). The API's answers pass through `zoned` on their way out, which writes each
time field through `tasks.config.clock.iso` ("2026-12-07T04:47:39Z"), so a page never has to
guess a zone; the pages show them as `clock.shown` does ("2026-12-07 04:47:39 UTC",
`static/console.js`). A time field is one named `at`, `next_due`, `throttled_until` or
ending in `_at`; a value that is not an ISO time is left as it is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tasks.config.clock import iso

__all__ = ["zoned", "TIME_FIELDS"]

TIME_FIELDS = frozenset({"at", "next_due", "throttled_until"})


def _is_time_field(name: str) -> bool:
    return name in TIME_FIELDS or name.endswith("_at")


def _zoned_time(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if not isinstance(value, str):
        return value
    try:
        return iso(datetime.fromisoformat(value.removesuffix("Z")))
    except ValueError:
        return value


def zoned(data: Any) -> Any:
    """`data` (JSON-able values) with every time field written by `clock.iso`."""
    if isinstance(data, dict):
        return {key: _zoned_time(value) if _is_time_field(str(key)) and value is not None
                else zoned(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [zoned(item) for item in data]
    return data
