"""The restock redo-log entry: one format, one parser, used everywhere.

An entry is nine ``:``-separated fields::

    orderItemId:redisId:queue:offset:skuId:skuNum:time:redisTerm:memberId

``deduct.lua`` writes it, the delay queue stores it as a sorted-set member, and the drainer
parses it back with :func:`parse_entry` before calling ``restock.lua``. Validation lives in
``RedoEntry.__post_init__``, so an invalid entry can be neither built nor parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tasks.store.validate import quote

__all__ = [
    "FIELDS",
    "MAX_SKU_NUM",
    "MalformedEntry",
    "RedoEntry",
    "check_id",
    "format_entry",
    "parse_entry",
]

# The largest quantity one deduction may take; deduct.lua receives it as an argument, so the
# script and the parser cannot disagree.
MAX_SKU_NUM = 1_000_000

FIELDS = (
    "order_item_id",
    "redis_id",
    "queue",
    "offset",
    "sku_id",
    "sku_num",
    "time_ms",
    "term",
    "member_id",
)
_ID_FIELDS = ("order_item_id", "queue", "sku_id", "member_id")
_INT_FIELDS = ("redis_id", "offset", "sku_num", "time_ms", "term")

# Canonical decimal only: int() would also take "+5", " 5", "5_0" and non-ASCII digits.
_INT = re.compile(r"-?[0-9]+")
# A whole canonical entry in one match (ids without ':', integers without sign or leading
# zeros): the drainer parses every member it drains, so the common case costs one regex call;
# anything else takes the field-by-field path, which names the first bad field.
_NAT = "(0|[1-9][0-9]*)"
_CANONICAL = re.compile(":".join(_NAT if f in _INT_FIELDS else "([^:]+)" for f in FIELDS))


class MalformedEntry(ValueError):
    """A redo-log entry (or one of its fields) that does not follow the format."""


def check_id(field: str, value: str) -> str:
    """Return `value` if it can be the id field `field`, else raise MalformedEntry."""
    if not isinstance(value, str) or not value:
        raise MalformedEntry(f"{field} must be a non-empty string, got {quote(value)}")
    if ":" in value:
        raise MalformedEntry(f"{field} must not contain ':', got {quote(value)}")
    return value


@dataclass(frozen=True)
class RedoEntry:
    """One deduction, as recorded in the redo log."""

    order_item_id: str
    redis_id: int
    queue: str
    offset: int
    sku_id: str
    sku_num: int
    time_ms: int
    term: int
    member_id: str

    def __post_init__(self) -> None:
        for field in _ID_FIELDS:
            check_id(field, getattr(self, field))
        for field in _INT_FIELDS:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise MalformedEntry(f"{field} must be an integer, got {value!r}")
            if value < 0:
                raise MalformedEntry(f"{field} must not be negative, got {value}")
        if not 0 < self.sku_num <= MAX_SKU_NUM:
            raise MalformedEntry(f"sku_num must be in 1..{MAX_SKU_NUM}, got {self.sku_num}")


def format_entry(e: RedoEntry) -> str:
    """The entry's text, exactly as deduct.lua writes it."""
    return ":".join(str(getattr(e, field)) for field in FIELDS)


def parse_entry(text: str | bytes) -> RedoEntry:
    """Parse one entry; raise MalformedEntry naming the first bad field.

    Only the canonical text is an entry (the one :func:`format_entry` writes back, e.g. no
    leading zeros): the drainer removes an entry from its delay queue by that text, so a
    member that would not round-trip is dead-lettered instead of lingering.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedEntry(f"entry is not UTF-8: {exc}") from None
    match = _CANONICAL.fullmatch(text)
    if match:
        item, shard, queue, offset, sku, num, time_ms, term, member = match.groups()
        return RedoEntry(item, int(shard), queue, int(offset), sku, int(num), int(time_ms),
                         int(term), member)
    parts = text.split(":")
    if len(parts) != len(FIELDS):
        raise MalformedEntry(
            f"entry must have {len(FIELDS)} ':'-separated fields, got {len(parts)}: "
            f"{quote(text)}")
    values: dict[str, str | int] = {}
    for field, raw in zip(FIELDS, parts, strict=True):
        if field in _INT_FIELDS:
            if not _INT.fullmatch(raw):
                raise MalformedEntry(f"{field} must be an integer, got {quote(raw)}")
            if raw != str(int(raw)):
                raise MalformedEntry(f"{field} must be a canonical integer, got {quote(raw)}")
            values[field] = int(raw)
        else:
            values[field] = raw
    return RedoEntry(**values)  # type: ignore[arg-type]
