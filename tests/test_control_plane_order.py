"""The order of the control plane's thread (tasks/worker/controlplane.py): a control verb runs
before the periodic rounds waiting there, verbs in the order they came, rounds likewise. (The
live path, one busy worker taking a `celery call` pause within a batch while beat's rounds keep
coming, is tests/ranges/test_control_plane.py.)"""

from __future__ import annotations

from tasks.ranges.tasks import pause, reconcile, resume, schedules, throttle
from tasks.worker.controlplane import ROUND, Waiting, runs_in_control_plane


def test_the_rounds_are_marked_and_every_control_runs_in_the_control_plane() -> None:
    assert reconcile.control_plane == schedules.control_plane == ROUND
    assert all(runs_in_control_plane(task) for task in (pause, resume, throttle, reconcile,
                                                        schedules))
    assert pause.control_plane is True


def test_verbs_go_before_waiting_rounds_each_in_the_order_they_came() -> None:
    waiting = Waiting()
    arrived = [(reconcile, "round-1"), (schedules, "round-2"), (pause, "pause"),
               (reconcile, "round-3"), (resume, "resume"), (throttle, "throttle")]
    for task, message in arrived:
        waiting.push(task, message)
    assert len(waiting) == len(arrived)
    ran = [waiting.pop()[1] for _ in arrived]
    assert ran == ["pause", "resume", "throttle", "round-1", "round-2", "round-3"]
    assert len(waiting) == 0


def test_a_verb_arriving_while_rounds_wait_overtakes_them_but_not_a_verb_before_it() -> None:
    waiting = Waiting()
    waiting.push(reconcile, "round-1")
    waiting.push(pause, "pause")
    assert waiting.pop()[1] == "pause"
    waiting.push(reconcile, "round-2")
    waiting.push(resume, "resume")
    waiting.push(throttle, "throttle")
    assert [waiting.pop()[1] for _ in range(4)] == ["resume", "throttle", "round-1", "round-2"]
