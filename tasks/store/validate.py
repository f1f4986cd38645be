"""Checks at the task boundary: bad arguments fail with `InvalidArguments` before any I/O,
and a message quotes at most a short prefix of a bad value (a 1 MB id must not be echoed
into results, dead letters or logs).

    order_id = text_arg("order_id", order_id, max_len=128)
    part = int_arg("partition", part, lo=0, hi=INT32_MAX)
"""

from __future__ import annotations

from typing import Any

__all__ = ["InvalidArguments", "INT32_MAX", "INT64_MAX", "QUOTE_LIMIT", "quote", "text_arg",
           "int_arg"]

# The widest values the database columns hold (Integer and BigInteger on every backend).
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Characters of a bad value an error message may quote.
QUOTE_LIMIT = 64


class InvalidArguments(ValueError):
    """A task was called with arguments it cannot run with; nothing was changed."""


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, cut to `limit` characters with the full length noted when longer."""
    if isinstance(value, str | bytes | list | tuple | dict) and len(value) > 4 * limit:
        # Do not build the repr of a huge value only to cut it.
        value = value[: 4 * limit]
        text = repr(value)
    else:
        text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)}+ chars)"


def text_arg(name: str, value: Any, max_len: int) -> str:
    """`value` if it is a non-empty string of at most `max_len` characters."""
    if not isinstance(value, str):
        raise InvalidArguments(f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidArguments(f"{name} must not be empty")
    if len(value) > max_len:
        raise InvalidArguments(
            f"{name} is {len(value)} characters, at most {max_len} allowed: {quote(value)}")
    return value


def int_arg(name: str, value: Any, lo: int = 0, hi: int = INT32_MAX) -> int:
    """`value` if it is an integer (not a bool) in `lo..hi`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArguments(f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InvalidArguments(f"{name} must be in {lo}..{hi}, got {quote(value)}")
    return value
