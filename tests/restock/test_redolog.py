"""The redo-log entry format: a table of good and malformed entries, and round trips."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.restock.redolog import (
    FIELDS,
    MAX_SKU_NUM,
    MalformedEntry,
    RedoEntry,
    format_entry,
    parse_entry,
)

GOOD = "oi-1:0:q1:7:sku-9:3:1700000000000:2:m-5"
ENTRY = RedoEntry(order_item_id="oi-1", redis_id=0, queue="q1", offset=7, sku_id="sku-9",
                  sku_num=3, time_ms=1700000000000, term=2, member_id="m-5")


def replace(field: str, raw: str) -> str:
    parts = GOOD.split(":")
    parts[FIELDS.index(field)] = raw
    return ":".join(parts)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD, ENTRY),
        (GOOD.encode(), ENTRY),
        (replace("sku_num", str(MAX_SKU_NUM)), dataclasses.replace(ENTRY, sku_num=MAX_SKU_NUM)),
        (replace("offset", "0"), dataclasses.replace(ENTRY, offset=0)),
        (replace("term", "0"), dataclasses.replace(ENTRY, term=0)),
        (replace("time_ms", "0"), dataclasses.replace(ENTRY, time_ms=0)),
        (replace("member_id", "m.ü"), dataclasses.replace(ENTRY, member_id="m.ü")),
    ],
)
def test_parse_good(text: str | bytes, expected: RedoEntry) -> None:
    assert parse_entry(text) == expected


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("oi-1:0:q1:7:sku-9:3:1700000000000:2", "fields"),
        (GOOD + ":extra", "fields"),
        ("", "fields"),
        (replace("order_item_id", ""), "order_item_id"),
        (replace("queue", ""), "queue"),
        (replace("sku_id", ""), "sku_id"),
        (replace("member_id", ""), "member_id"),
        (replace("redis_id", "x"), "redis_id"),
        (replace("redis_id", "-1"), "redis_id"),
        (replace("offset", "7.0"), "offset"),
        (replace("offset", "-1"), "offset"),
        (replace("offset", "+7"), "offset"),
        (replace("offset", " 7"), "offset"),
        (replace("offset", "1_0"), "offset"),
        (replace("sku_num", "0"), "sku_num"),
        (replace("sku_num", "-3"), "sku_num"),
        (replace("sku_num", str(MAX_SKU_NUM + 1)), "sku_num"),
        (replace("sku_num", "three"), "sku_num"),
        (replace("time_ms", "-5"), "time_ms"),
        (replace("time_ms", ""), "time_ms"),
        (replace("term", "-1"), "term"),
        (replace("term", "1e3"), "term"),
        (replace("term", "٣"), "term"),
        (b"\xff" + GOOD.encode(), "UTF-8"),
    ],
)
def test_parse_malformed_names_the_field(text: str | bytes, field: str) -> None:
    with pytest.raises(MalformedEntry, match=field):
        parse_entry(text)


@pytest.mark.parametrize("field", ["order_item_id", "queue", "sku_id", "member_id"])
def test_colon_inside_an_id_is_refused_when_building(field: str) -> None:
    with pytest.raises(MalformedEntry, match=field):
        dataclasses.replace(ENTRY, **{field: "a:b"})


def test_malformed_entry_is_a_value_error() -> None:
    assert issubclass(MalformedEntry, ValueError)


def test_format_round_trip() -> None:
    assert format_entry(ENTRY) == GOOD
    assert parse_entry(format_entry(ENTRY)) == ENTRY


ids = st.text(st.characters(blacklist_characters=":", blacklist_categories=("Cs",)), min_size=1,
              max_size=20)
naturals = st.integers(min_value=0, max_value=2**53)


@given(
    st.builds(RedoEntry, order_item_id=ids, redis_id=naturals, queue=ids, offset=naturals,
              sku_id=ids, sku_num=st.integers(1, MAX_SKU_NUM), time_ms=naturals, term=naturals,
              member_id=ids)
)
def test_round_trip_property(entry: RedoEntry) -> None:
    text = format_entry(entry)
    assert parse_entry(text) == entry
    assert parse_entry(text.encode("utf-8")) == entry
    assert format_entry(parse_entry(text)) == text
