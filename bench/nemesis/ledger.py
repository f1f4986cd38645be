"""Judging a saga's ledger when Redis, which holds it, may have been wiped mid-saga.

The example saga's effects *are* its ledger entries (tasks.examples.saga): a wipe destroys the
effects made so far, and a compensation that runs afterwards correctly finds nothing to undo
(saga_undo.lua undoes only a step the ledger shows). So a saga is judged on two things:

- the whole history, what the nemesis kept before each wipe followed by what Redis holds now,
  cut into attempts (a redelivered saga runs again after the sweeper undid the first): in an
  attempt no entry twice (nothing undone twice), no step after an undo (a saga undone while
  live and then carried on), no undo of a step that never ran; every attempt but the last
  fully undone;
- the surviving epoch, what Redis holds now, against how the journal ended: rolled back or
  taken over, every step in it is undone in it; otherwise (success, or it never ran) it holds
  no undo. With no wipe during the saga, the ledger must be exactly the whole saga or its done
  steps each undone once in reverse (`valid_ledgers`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tasks.examples.saga import STEPS

__all__ = ["valid_ledgers", "judge", "attempts"]

UNDO_OF = {undo: done for done, undo in STEPS}
STEP_NAMES = tuple(done for done, _ in STEPS)


def valid_ledgers() -> set[tuple[str, ...]]:
    """The whole saga, or its first k steps followed by their undos in reverse (k = 0..3)."""
    valid = {STEP_NAMES}
    for k in range(len(STEPS) + 1):
        valid.add(STEP_NAMES[:k] + tuple(undo for _, undo in reversed(STEPS[:k])))
    return valid


def _history_fault(history: Sequence[str]) -> str | None:
    seen: set[str] = set()
    undoing = False
    for entry in history:
        if entry in seen:
            return f"{entry} twice"
        if entry in UNDO_OF and UNDO_OF[entry] not in seen:
            return f"{entry} without {UNDO_OF[entry]} before it"
        if entry in STEP_NAMES and undoing:
            return f"{entry} after the compensation began"
        undoing = undoing or entry in UNDO_OF
        seen.add(entry)
    return None


def attempts(history: Sequence[str]) -> list[list[str]]:
    """The ledger cut before each first step: a redelivered saga (its worker died, acks_late)
    runs again under the same order after the sweeper undid the first attempt."""
    cut: list[list[str]] = []
    for entry in history:
        if entry == STEP_NAMES[0] or not cut:
            cut.append([])
        cut[-1].append(entry)
    return cut


def _closed(attempt: Sequence[str]) -> bool:
    return all(undo in attempt for done, undo in STEPS if done in attempt)


def judge(kept: Sequence[str], now: Sequence[str], compensated: bool) -> str | None:
    """None if the saga's ledger is whole; otherwise what is wrong with it. Every attempt but
    the last must be fully undone; the last is judged as below."""
    tried = attempts([*kept, *now])
    for attempt in tried:
        wrong = _history_fault(attempt)
        if wrong:
            return wrong
    if not kept and not all(_closed(a) for a in tried[:-1]):
        return "an earlier attempt was not undone before the saga ran again"
    last = tried[-1] if tried else []
    if not kept:
        return None if tuple(last) in valid_ledgers() else "half done"
    now = now[len(now) - min(len(now), len(last)):]  # the last attempt's part after the wipe
    orphans = [e for e in now if e in UNDO_OF and UNDO_OF[e] not in now]
    if orphans:  # saga_undo.lua undoes only a step the (surviving) ledger shows
        return f"{orphans} undone after the wipe took the step"
    if compensated:
        left = [e for e in now if e in STEP_NAMES and
                not any(UNDO_OF.get(u) == e for u in now)]
        return f"{left} not undone after the wipe" if left else None
    if any(e in UNDO_OF for e in now):
        return "undone though its journal says it was not rolled back"
    return None
