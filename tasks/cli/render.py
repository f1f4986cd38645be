"""The CLI's tables, in one place: the wings' plain status views (`tasks.ranges.status`,
`tasks.restock.status`, `tasks.deadletters.view`) drawn with rich, the console they are printed
on, and `status --watch`'s redraw. No other module builds a rich table; the console serialises
the same views as JSON instead.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from tasks.cli.fit import Col, records, widths
from tasks.cli.words import duration, pairs, when, word
from tasks.ranges.tables import PartitionStatus
from tasks.store.db import utcnow

if TYPE_CHECKING:
    from tasks.deadletters.store import Summary
    from tasks.deadletters.view import LettersView
    from tasks.ranges.paging import PartitionPage
    from tasks.ranges.status import JobSummary, PartitionView
    from tasks.restock.status import ShardView

__all__ = ["console_for", "PIPED_WIDTH", "COMPACT_BELOW", "fitted", "quote_text",
           "jobs_table", "partitions_table", "page_renderable", "shards_table",
           "letters_renderable", "letters_table", "status_renderable", "watch", "dry_run_lines",
           "print_lines", "queues_line"]

# Width of a console whose output is piped: wide enough that no table row is wrapped or cut,
# so each row is one line a script can read (`--json` is the format meant for programs).
PIPED_WIDTH = 10_000

# Consoles narrower than this get the compact partition tables (the wide one needs ~130).
COMPACT_BELOW = 130

# A job name longer than this is cut with "…" in a table (a shorter one is never split).
JOB_NAME_MAX = 40

NO_PARTITIONS = ("no range job has partitions yet "
                 "(start one: celery -A tasks call tasks.ranges.start --args '[\"cm_data\"]')")


def console_for() -> Console:
    """The console CLI output goes to: in a terminal, the terminal's width (tables fold their
    cells to fit it, nothing is cut with "..."); piped, PIPED_WIDTH columns and no colour."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=PIPED_WIDTH, no_color=True, highlight=False)


def quote_text(text: str, limit: int = 48) -> str:
    """`text` cut to `limit` characters (a ref or reason may quote a long bad value)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def print_lines(lines: Sequence[str]) -> None:
    """Plain lines on the CLI's console: in a terminal wrapped at its width between words (a
    word is only folded when it is wider than the terminal); piped, one line each."""
    console = console_for()
    for line in lines:
        console.print(Text(line), soft_wrap=not console.is_terminal)


# -- range jobs ------------------------------------------------------------------------------

def dry_run_lines(report: dict[str, Any]) -> list[str]:
    """`jobs start JOB --dry-run` as plain lines (`tasks.ranges.dryrun.DryRun.as_dict`)."""
    about = "" if report["estimate_exact"] else "about "
    lines = [f"dry run of {report['job']} (params: {pairs(report['params'])})",
             f"plan: {report['partitions_total']:,} partitions, estimated rows {about}"
             f"{report['estimated_rows']:,}"]
    for p in report["partitions"]:
        lines.append(f"  part {p['part']}  ids {p['lo']}..{p['hi']}  from {p['from_id']}  "
                     f"estimated rows {'' if p['exact'] else 'about '}{p['estimated_rows']:,}")
    if report["partitions_total"] > len(report["partitions"]):
        lines.append(f"  ... and {report['partitions_total'] - len(report['partitions'])} "
                     "more")
    sample = report["sample"]
    if report["sql"] is not None:
        lines += [f"first batch (part {sample['part']}):",
                  *(f"  {line.strip()}" for line in report["sql"].splitlines()),
                  f"first rows ({len(report['rows'])} of {sample['rows']:,} read in "
                  f"{duration(sample['seconds'])}):"]
        lines += [f"  {pairs(row) if isinstance(row, dict) else word(row)}"
                  for row in report["rows"]]
    lines.append(f"ETA {duration(report['eta_s'])} (one worker's reading rate, "
                 f"{word(sample.get('rows_per_s', 0))} rows/s; process not run)")
    lines.append("nothing was written: no run, no lease, no Redis key, no work row")
    return lines


def jobs_table(summaries: Sequence[JobSummary], width: int = PIPED_WIDTH) -> RenderableType:
    """A row per range job: its run, rows done, ids walked, rows/s (and cap), ETA. Narrower
    than that needs, two-line cells (the job over its run, rows over the rate); narrower
    still, a block per job. A job's name is never split (cut with "…" past JOB_NAME_MAX)."""
    wide: list[tuple[str, ...]] = []
    narrow: list[tuple[str, ...]] = []
    for s in summaries:
        job = s.job if len(s.job) <= JOB_NAME_MAX else s.job[:JOB_NAME_MAX - 1] + "…"
        run = s.state if s.run is None else f"{s.state} (run {s.run})"
        done = f"{s.rows_done:,}" + (f" ({s.rows_skipped:,} skipped)" if s.rows_skipped else "")
        rate = f"{s.rows_per_s:,.0f}" + (f" (cap {s.throttle_rows_per_s:,.0f})"
                                         if s.throttle_rows_per_s else "")
        walked = f"{s.ids_walked:,} of {s.ids_planned:,} ({s.share:.1%})"
        states = [f"{n} {state}" for state, n in s.partitions.items()]
        wide.append((job, run, done, walked, rate, duration(s.eta_s), ", ".join(states)))
        narrow.append((f"{job}\n{run}", f"{done}\n{rate}", walked, duration(s.eta_s),
                       "\n".join(states)))
    return fitted("range jobs", width, (JOB_COLUMNS, wide, True),
                  (NARROW_JOB_COLUMNS, narrow, False))


JOB_COLUMNS = (Col("job"), Col("run"), Col("rows done", right=True),
               Col("ids walked", right=True), Col("rows/s", right=True),
               Col("ETA", right=True), Col("partitions"))
NARROW_JOB_COLUMNS = (Col("job\nrun"), Col("rows done\nrows/s", right=True),
                      Col("ids walked", right=True), Col("ETA", right=True),
                      Col("partitions"))
PARTITION_COLUMNS = (Col("job"), Col("part", right=True), Col("ids", right=True),
                     Col("state", whole=False), Col("owner", whole=False),
                     Col("checkpoint", right=True), Col("rows done", right=True),
                     Col("rows/s", right=True), Col("fence", right=True),
                     Col("takeovers", right=True))
COMPACT_PARTITION_COLUMNS = (Col("part", right=True), Col("ids\ncheckpoint", right=True),
                             Col("state", whole=False), Col("owner", whole=False),
                             Col("rows done\nrows/s", right=True),
                             Col("fence\ntakeovers", right=True))


def fitted(title: str, width: int,
           *layouts: tuple[Sequence[Col], Sequence[Sequence[str]], bool]) -> RenderableType:
    """The first of `layouts` (columns, rows, ruled edges) that fits `width` without
    splitting a whole word (`tasks.cli.fit`), drawn; if none does, the last one's rows as
    blocks of `name: value` lines."""
    for cols, rows, edge in layouts:
        fixed = widths(cols, rows, width, edge)
        if fixed is None:
            continue
        table = Table(title=title, box=box.HEAVY_HEAD if edge else box.SIMPLE_HEAD,
                      show_edge=edge)
        for col, size in zip(cols, fixed, strict=True):
            table.add_column(col.header, width=size, overflow="fold",
                             justify="right" if col.right else "left")
        for row in rows:
            table.add_row(*row)
        return table
    cols, rows, _ = layouts[-1]
    return Text("\n".join(records(title, cols, rows)))


def partitions_table(views: Sequence[PartitionView], width: int = PIPED_WIDTH,
                     job: str | None = None) -> RenderableType:
    """Every partition (of `job`, when given); on a console narrower than COMPACT_BELOW, one
    table per job with two-line cells (ids over checkpoint, rows over rate, fence over
    takeovers), or a block per partition where even that does not fit."""
    if not views:
        return Text(NO_PARTITIONS if job is None else
                    f"range job {job!r} has no partitions (never started, or no such job)")
    if width < COMPACT_BELOW:
        return Group(*(_compact_table(job, [v for v in views if v.job == job], width)
                       for job in dict.fromkeys(v.job for v in views)))
    rows = [(v.job, str(v.part), f"{v.lo}..{v.hi}", _state(v), v.owner or "-",
             str(v.checkpoint), f"{v.rows_done:,}", f"{v.rows_per_s:,.0f}", str(v.fence),
             str(v.takeovers)) for v in views]
    return fitted("range partitions", width, (PARTITION_COLUMNS, rows, True))


def page_renderable(page: PartitionPage, width: int = PIPED_WIDTH) -> RenderableType:
    """One page of partitions and a line under it: how many of how many match, and the flags
    that show the next and previous pages."""
    query = page.query
    if page.total == 0 and query.filtered:
        return Text(f"no partition matches ({_filter_words(page)})")
    if page.total == 0:
        return partitions_table([], width, query.job)
    shown = f"{len(page.partitions):,} of {page.total:,} partitions"
    if query.filtered:
        shown += f" ({_filter_words(page)})"
    steps = [f"next page: --after {page.next}" if page.next is not None else "last page"]
    if page.prev is not None:
        steps.append("previous page: " + (f"--after {page.prev}" if page.prev else
                                          "without --after"))
    return Group(partitions_table(page.partitions, width, query.job),
                 Text(f"{shown}; " + "; ".join(steps)))


def _filter_words(page: PartitionPage) -> str:
    query = page.query
    words = ["slowest running first"] if query.slowest else []
    if query.states:
        words.append("state " + " or ".join(query.states))
    if query.owner:
        words.append(f"owner {query.owner}*")
    return ", ".join(words)


def _compact_table(job: str, views: Sequence[PartitionView], width: int) -> RenderableType:
    rows = [(str(v.part), f"{v.lo}..{v.hi}\n{v.checkpoint}", _state(v), v.owner or "-",
             f"{v.rows_done:,}\n{v.rows_per_s:,.0f}/s", f"{v.fence}\n{v.takeovers}")
            for v in views]
    return fitted(f"partitions of {job}", width, (COMPACT_PARTITION_COLUMNS, rows, False))


def _state(v: PartitionView) -> str:
    if v.status == PartitionStatus.FAILED:
        return f"failed: {v.error}"
    if v.status == PartitionStatus.RUNNING and v.throttled_until is not None:
        wait = (v.throttled_until - utcnow()).total_seconds()
        if wait > 0:
            return f"running, throttled {duration(wait)}"
    return v.status


# -- restock ---------------------------------------------------------------------------------

SHARD_COLUMNS = (Col("shard", right=True), Col("term", right=True), Col("maintenance"),
                 Col("queue"), Col("queued", right=True), Col("due", right=True),
                 Col("unsynced log", right=True), Col("dead letters", right=True))
NARROW_SHARD_COLUMNS = (Col("shard\nterm", right=True), Col("maintenance"), Col("queue"),
                        Col("queued\ndue", right=True), Col("unsynced\nlog", right=True),
                        Col("dead\nletters", right=True))


def shards_table(views: Sequence[ShardView], now_ms: int,
                 width: int = PIPED_WIDTH) -> RenderableType:
    """A row per shard and queue: term, maintenance window, queued, due, unsynced log;
    narrower, the shard over its term and the queued over the due entries."""
    wide = [row for v in views for row in _shard_rows(v, now_ms)]
    narrow = [(f"{shard}\n{term}".strip(), window, queue, f"{queued}\n{due}", log, letters)
              for shard, term, window, queue, queued, due, log, letters in wide]
    return fitted("restock shards", width, (SHARD_COLUMNS, wide, True),
                  (NARROW_SHARD_COLUMNS, narrow, False))


def _shard_rows(v: ShardView, now_ms: int) -> list[tuple[str, ...]]:
    """The cells of one shard: a row per queue (the shard's own cells on the first only)."""
    if v.error is not None:
        return [(str(v.shard), "-", f"unreachable: {v.error}", "-", "-", "-", "-",
                 str(v.dead_letters))]
    rows: list[tuple[str, ...]] = []
    for i, queue in enumerate(v.queued):
        first = i == 0
        rows.append((str(v.shard) if first else "", str(v.term) if first else "",
                     _window(v, now_ms) if first else "", queue, f"{v.queued[queue]:,}",
                     f"{v.due[queue]:,}", f"{v.backlog[queue]:,}",
                     str(v.dead_letters) if first else ""))
    return rows


def _window(v: ShardView, now_ms: int) -> str:
    """The maintenance window in words: now, never rebuilt, or the time to the next."""
    if v.maintaining:
        return "in maintenance now"
    if v.next_maintain_ms is None:
        return "never rebuilt: due now"
    return f"next in {duration(max(v.next_maintain_ms - now_ms, 0) / 1000)}"


# -- dead letters ----------------------------------------------------------------------------

def letters_renderable(view: LettersView, width: int = PIPED_WIDTH) -> RenderableType:
    """`status`'s dead letters: the count per kind, then the newest few."""
    if not view.counts:
        return Text("no dead letters")
    head = Text(f"dead letters: {view.total:,} ("
                + ", ".join(f"{kind}: {n:,}" for kind, n in sorted(view.counts.items())) + ")")
    return Group(head, letters_table(view.recent, width, reason=120))


LETTER_COLUMNS = (Col("id", right=True), Col("kind"), Col("ref", whole=False),
                  Col("created"), Col("replayed as", whole=False), Col("reason", whole=False))
NARROW_LETTER_COLUMNS = (Col("id\nkind"), Col("ref", whole=False),
                         Col("created\nreplayed as", whole=False), Col("reason", whole=False))


def letters_table(letters: Sequence[Summary], width: int = PIPED_WIDTH,
                  reason: int = 200) -> RenderableType:
    """`deadletters list` (and `status`'s newest few): the letters, without their payloads;
    narrower, the kind under the id and the replay under the time."""
    wide = [(str(s.id), s.kind, quote_text(s.ref), when(s.created_at),
             s.replay_task_id or "-", quote_text(s.reason, reason)) for s in letters]
    narrow = [(f"{i}\n{kind}", ref, f"{created}\n{replay}", why)
              for i, kind, ref, created, replay, why in wide]
    return fitted(f"newest {len(letters)} dead letters", width, (LETTER_COLUMNS, wide, True),
                  (NARROW_LETTER_COLUMNS, narrow, False))


# -- status ----------------------------------------------------------------------------------

def status_renderable(views: dict[str, Any], width: int) -> RenderableType:
    """`python -m tasks status`: the sections its views hold (`tasks.cli.core._views`): the
    jobs (when any) and a page of partitions, the restock shards, the dead letters and each
    queue's backlog."""
    parts: list[RenderableType] = []
    if "ranges" in views:
        page, summaries = views["ranges"]
        parts += [jobs_table(summaries, width)] if summaries else []
        parts.append(page_renderable(page, width))
    if "restock" in views:
        parts.append(shards_table(views["restock"], views["now"], width))
    if "letters" in views:
        parts.append(letters_renderable(views["letters"], width))
    if "queues" in views:
        parts.append(Text(queues_line(views["queues"])))
    return Group(*parts)


def watch(console: Console, snapshot: Callable[[], RenderableType], every: float) -> None:
    """Redraw `snapshot()` every `every` seconds in place until Ctrl-C; piped, print one
    snapshot after another (a live display would only show the last)."""
    from rich.live import Live

    def stamped() -> RenderableType:
        return Group(Text(f"status at {when(utcnow())}, every {duration(every)} "
                          "(Ctrl-C to stop)"), snapshot())

    try:
        if not console.is_terminal:
            while True:
                console.print(stamped())
                time.sleep(every)
        with Live(stamped(), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(every)
                live.update(stamped(), refresh=True)
    except KeyboardInterrupt:
        pass


def queues_line(queues: Sequence[dict[str, Any]] | None) -> str:
    """Each queue's backlog in one line (None: the broker did not answer;
    `tasks.worker.backlog`)."""
    if queues is None:
        return "queues: the broker does not answer"
    return "queues: " + ", ".join(f"{q['name']} {word(q['messages'])}" + (
        f" (oldest {duration(q['oldest_s'])})" if q["oldest_s"] is not None else "")
        for q in queues)
