"""Bad arguments to the rollback tasks fail with InvalidArguments before any I/O, quoting at
most a short prefix of the bad value (issue 9 item 15)."""

from __future__ import annotations

from typing import Any

import pytest

from tasks.examples.saga import MAX_ORDER_ID, place_order
from tasks.rollback.tasks import rollback_task
from tasks.store.validate import InvalidArguments
from tests.support.sagas import sleepy_saga

HUGE = "o" * 1_000_000


@pytest.mark.parametrize(
    ("task", "args", "says"),
    [
        (place_order, (HUGE,), "order_id is 1000000 characters, at most 128 allowed"),
        (place_order, ("x" * (MAX_ORDER_ID + 1),), "at most 128 allowed"),
        (place_order, (42,), "order_id must be a string, got int"),
        (place_order, ("",), "order_id must not be empty"),
        (place_order, ("o-1", "x" * 10_000), "fail_at must be one of"),
        (place_order, ("o-1", ["ship"]), "fail_at must be one of"),
        (sleepy_saga, ("o-1", 10**9), "seconds must be a number in 0..120"),
        (rollback_task, (HUGE, "why"), "task_id is 1000000 characters"),
    ],
)
def test_bad_arguments_are_refused_with_a_short_message(
    task: Any, args: tuple[Any, ...], says: str
) -> None:
    result = task.apply(args=args)
    assert isinstance(result.result, InvalidArguments), result.result
    message = str(result.result)
    assert says in message and len(message) < 300
    assert len(result.traceback or "") < 5000  # the traceback does not carry the value either


def test_a_good_order_id_of_the_longest_length_is_accepted() -> None:
    from tasks.examples.saga import check_order

    assert check_order("x" * MAX_ORDER_ID, "ship") == ("x" * MAX_ORDER_ID, "ship")
