"""How the CLI's text output writes a value for people: words, never a Python repr.

`True`/`False` are yes/no, a missing value is "-", a list is a comma list, a mapping is
`name=value` pairs, a time is `tasks.config.clock.shown` ("2026-12-07 04:47:39 UTC") and a
duration is spoken in units ("3 min 4 s"). `--json` keeps the values themselves (times through
`tasks.config.clock.iso`); this module is for the lines and tables only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from tasks.config.clock import shown

__all__ = ["word", "duration", "when", "when_iso", "pairs"]

MISSING = "-"


def word(value: Any) -> str:
    """`value` as a word or a short phrase: yes/no, "-", a comma list, `k=v` pairs."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return shown(value)
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, Mapping):
        return pairs(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(word(v) for v in value) or "none"
    return str(value)


def pairs(values: Mapping[str, Any] | None) -> str:
    """A mapping as `name=value` pairs, each value in words ("-" for none)."""
    if not values:
        return MISSING
    return " ".join(f"{k}={_bare(v)}" for k, v in values.items())


def _bare(value: Any) -> str:
    """A parameter's value as the operator types it (`--param NAME=VALUE`): None is empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return ",".join(_bare(v) for v in value)
    return word(value)


def duration(seconds: float | None) -> str:
    """A duration as people say it: "250 ms", "4.2 s", "45 s", "3 min 4 s", "2 h 5 min",
    "3 d 4 h"; "-" for none."""
    if seconds is None:
        return MISSING
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10 and round(seconds, 1) != round(seconds):
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    for big, big_name, small, small_name in ((86_400, "d", 3600, "h"), (3600, "h", 60, "min"),
                                             (60, "min", 1, "s")):
        if whole >= big:
            head, rest = divmod(whole, big)
            tail = rest // small
            return f"{head} {big_name}" + (f" {tail} {small_name}" if tail else "")
    return f"{whole} s"


def when(value: datetime | float | None) -> str:
    """A time for people, with its zone ("-" for none)."""
    return shown(value, MISSING)


def when_iso(text: str | None) -> str:
    """An ISO 8601 time as a view's JSON holds it ("...Z"), written for people."""
    if not text:
        return MISSING
    return shown(datetime.fromisoformat(text.replace("Z", "+00:00")))
