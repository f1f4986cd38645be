"""How a table of the CLI fits a terminal, decided before it is drawn (plain text, no rich).

Rich narrows a table that is too wide by folding its widest cells wherever they break, so a
job's name or a header could be split mid-word ("email_backfil" / "l"). Here each column says
whether its words must stay whole (names, numbers, states, times, headers) or may fold (an
owner, a task id, an error: opaque text that is kept whole rather than cut). `widths` gives
every column a fixed width in which no whole word is split, or None when the terminal is too
narrow for that: the caller then draws a narrower layout, or `records` (one block per row,
one `name: value` line per cell, wrapped between words).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Col", "widths", "records", "FOLD_MIN"]

# The narrowest a foldable column gets (its longer words fold across lines).
FOLD_MIN = 12


@dataclass(frozen=True)
class Col:
    """A table column: its header (lines split by "\\n"), whether its words stay whole, and
    its justification."""

    header: str
    whole: bool = True
    right: bool = False


def _longest_word(texts: Sequence[str]) -> int:
    return max((len(word) for text in texts for word in text.split()), default=1)


def _longest_line(texts: Sequence[str]) -> int:
    return max((len(line) for text in texts for line in text.splitlines()), default=1)


def widths(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int,
           edge: bool = True) -> list[int] | None:
    """Each column's width (padding and rules excluded) so the table is at most `width`
    wide and no whole column splits a word; None when that cannot be. A table drawn with
    padding 1 each side and one rule between columns (and, with `edge`, at both ends)."""
    room = width - 2 * len(cols) - (len(cols) - 1) - (2 if edge else 0)
    cells = [[col.header, *(row[i] for row in rows)] for i, col in enumerate(cols)]
    want = [_longest_line(texts) for texts in cells]
    least = [_longest_word(texts) if col.whole else min(FOLD_MIN, want[i])
             for i, (col, texts) in enumerate(zip(cols, cells, strict=True))]
    if sum(least) > room:
        return None
    if sum(want) <= room:
        return want
    spare = room - sum(least)
    extra = [w - m for w, m in zip(want, least, strict=True)]
    total = sum(extra)
    return [m + spare * e // total for m, e in zip(least, extra, strict=True)]


def records(title: str, cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> list[str]:
    """The table as lines: its title, then per row the first cell as a heading and one
    `header: value` line per other cell (a two-line header over a two-line value gives two
    lines)."""
    lines = [title] if title else []
    for row in rows:
        heads = zip(cols[0].header.splitlines(), row[0].splitlines(), strict=False)
        lines.append(", ".join(f"{name} {value}" if value.isdigit() else value
                               for name, value in heads))
        for col, cell in zip(cols[1:], row[1:], strict=True):
            names, values = col.header.splitlines(), cell.splitlines()
            if len(names) == len(values) > 1:
                lines += [f"  {n}: {v}" for n, v in zip(names, values, strict=True) if v]
            elif cell:
                lines.append(f"  {' / '.join(names)}: {', '.join(values)}")
    return lines
