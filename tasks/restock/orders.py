"""An order's lines, validated once: `order_lines(items)` turns the `items` argument of
`tasks.restock.place_order` (or of `Shop.place_order`) into checked lines, or raises
`InvalidOrder` with a message that names the bad field.

`InvalidOrder` is both an `OrderError` (what the shop's callers catch) and the worker's
`InvalidArguments` (what task-boundary handling expects of a bad argument), so there is one
exception for one mistake wherever it is caught.
"""

from __future__ import annotations

from typing import Any

from tasks.restock.redolog import MAX_SKU_NUM, MalformedEntry, check_id
from tasks.store.validate import InvalidArguments, int_arg, quote, text_arg

__all__ = ["ID_MAX_LEN", "MAX_LINES", "Line", "OrderError", "InvalidOrder",
           "DuplicateOrderItem", "order_lines", "order_id_arg"]

ID_MAX_LEN = 128  # order, member, order item and SKU ids: their String(128) columns
MAX_LINES = 1000  # lines of one order

Line = tuple[str, str, int]  # order_item_id, sku_id, qty


class OrderError(ValueError):
    """Bad input for an order or a payment; nothing was changed."""


class InvalidOrder(OrderError, InvalidArguments):
    """The order's arguments cannot be an order (empty, malformed, an id too long or not an
    id, a bad quantity)."""


class DuplicateOrderItem(OrderError):
    """An order item id is repeated, or already belongs to another order or another line."""


def order_id_arg(field_name: str, value: Any) -> str:
    """`value` if it can be the id `field_name` (a string of 1..ID_MAX_LEN characters
    without ':'); `InvalidOrder` otherwise."""
    try:
        text_arg(field_name, value, max_len=ID_MAX_LEN)
        return check_id(field_name, value)
    except (InvalidArguments, MalformedEntry) as exc:
        raise InvalidOrder(str(exc)) from None


def order_lines(items: Any) -> list[Line]:
    """`items` ([[order_item_id, sku_id, qty], ...], 1..MAX_LINES of them) as checked lines:
    ids as `order_id_arg` takes them, each qty an integer in 1..MAX_SKU_NUM, no order item
    id twice. `InvalidOrder` (or `DuplicateOrderItem`) quoting at most a short prefix of a
    bad value; nothing is read or written."""
    if not isinstance(items, list | tuple) or not 0 < len(items) <= MAX_LINES:
        raise InvalidOrder(f"items must be a list of 1..{MAX_LINES} "
                           f"[order_item_id, sku_id, qty], got {quote(items)}")
    lines: list[Line] = []
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 3:
            raise InvalidOrder(f"each item must be [order_item_id, sku_id, qty], got "
                               f"{quote(item)}")
        order_item_id = order_id_arg("order_item_id", item[0])
        sku_id = order_id_arg("sku_id", item[1])
        try:
            qty = int_arg("qty", item[2], lo=1, hi=MAX_SKU_NUM)
        except InvalidArguments as exc:
            raise InvalidOrder(f"{exc} (order item {quote(order_item_id)})") from None
        lines.append((order_item_id, sku_id, qty))
    ids = [line[0] for line in lines]
    if len(set(ids)) != len(ids):
        raise DuplicateOrderItem(f"order item ids repeat within the order: {quote(ids)}")
    return lines
