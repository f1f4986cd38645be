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

from tasks.ranges.params import as_text
from tasks.ranges.status import format_eta
from tasks.ranges.tables import PartitionStatus
from tasks.store.db import utcnow

if TYPE_CHECKING:
    from tasks.deadletters.store import Summary
    from tasks.deadletters.view import LettersView
    from tasks.ranges.paging import PartitionPage
    from tasks.ranges.status import JobSummary, PartitionView
    from tasks.restock.status import ShardView

__all__ = ["console_for", "PIPED_WIDTH", "COMPACT_BELOW", "quote_text", "jobs_table",
           "partitions_table", "page_renderable", "shards_table", "letters_renderable",
           "letters_table", "status_renderable", "watch", "dry_run_lines"]

# Width of a console whose output is piped: wide enough that no table row is wrapped or cut,
# so each row is one line a script can read (`--json` is the format meant for programs).
PIPED_WIDTH = 10_000

# Consoles narrower than this get the compact partition tables (the wide one needs ~130).
COMPACT_BELOW = 130

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


# -- range jobs ------------------------------------------------------------------------------

def dry_run_lines(report: dict[str, Any]) -> list[str]:
    """`jobs start JOB --dry-run` as plain lines (`tasks.ranges.dryrun.DryRun.as_dict`)."""
    shown = as_text(report["params"])
    about = "" if report["estimate_exact"] else "about "
    lines = [f"dry run of {report['job']} (params: {shown})",
             f"plan: {report['partitions_total']} partitions, estimated rows {about}"
             f"{report['estimated_rows']}"]
    for p in report["partitions"]:
        lines.append(f"  part {p['part']}  ids {p['lo']}..{p['hi']}  from {p['from_id']}  "
                     f"estimated rows {'' if p['exact'] else 'about '}{p['estimated_rows']}")
    if report["partitions_total"] > len(report["partitions"]):
        lines.append(f"  ... and {report['partitions_total'] - len(report['partitions'])} "
                     "more")
    sample = report["sample"]
    if report["sql"] is not None:
        lines += [f"first batch (part {sample['part']}):",
                  *(f"  {line.strip()}" for line in report["sql"].splitlines()),
                  f"first rows ({len(report['rows'])} of {sample['rows']} read in "
                  f"{sample['seconds']:.3f}s):"]
        lines += [f"  {row}" for row in report["rows"]]
    lines.append(f"ETA {format_eta(report['eta_s'])} (one worker's reading rate, "
                 f"{sample.get('rows_per_s', 0):g} rows/s; process not run)")
    lines.append("nothing was written: no run, no lease, no Redis key, no work row")
    return lines


def jobs_table(summaries: Sequence[JobSummary]) -> Table:
    """A row per range job: its run, rows done, ids walked, rows/s (and cap), ETA."""
    table = Table(title="range jobs")
    for column in ("job", "run", "rows done", "ids walked", "rows/s", "ETA", "partitions"):
        table.add_column(column, overflow="fold", justify="left" if column in (
            "job", "run", "partitions") else "right")
    for s in summaries:
        cap = f" (cap {s.throttle_rows_per_s:,.0f})" if s.throttle_rows_per_s else ""
        table.add_row(s.job, s.state if s.run is None else f"{s.state} (run {s.run})",
                      f"{s.rows_done:,}" + (f" ({s.rows_skipped:,} skipped)"
                                            if s.rows_skipped else ""),
                      f"{s.ids_walked:,} of {s.ids_planned:,} ({s.share:.1%})",
                      f"{s.rows_per_s:,.0f}{cap}", format_eta(s.eta_s),
                      ", ".join(f"{n} {state}" for state, n in s.partitions.items()))
    return table


def partitions_table(views: Sequence[PartitionView], width: int = 10_000,
                     job: str | None = None) -> RenderableType:
    """Every partition (of `job`, when given); on a console narrower than COMPACT_BELOW, one
    table per job with two-line cells (ids over checkpoint, rows over rate, fence over
    takeovers)."""
    if not views:
        return Text(NO_PARTITIONS if job is None else
                    f"range job {job!r} has no partitions (never started, or no such job)")
    if width < COMPACT_BELOW:
        return Group(*(_compact_table(job, [v for v in views if v.job == job])
                       for job in dict.fromkeys(v.job for v in views)))
    table = Table(title="range partitions")
    for column in ("job", "part", "ids", "state", "owner", "checkpoint", "rows done", "rows/s",
                   "fence", "takeovers"):
        table.add_column(column, overflow="fold", justify="right" if column not in (
            "job", "state", "owner") else "left")
    for v in views:
        table.add_row(v.job, str(v.part), f"{v.lo}..{v.hi}", _state(v), v.owner or "-",
                      str(v.checkpoint), str(v.rows_done), f"{v.rows_per_s:,.0f}", str(v.fence),
                      str(v.takeovers))
    return table


def page_renderable(page: PartitionPage, width: int = 10_000) -> RenderableType:
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


def _compact_table(job: str, views: Sequence[PartitionView]) -> Table:
    table = Table(title=f"partitions of {job}", box=box.SIMPLE_HEAD)
    for column in ("part", "ids\ncheckpoint", "state", "owner", "rows done\nrows/s",
                   "fence\ntakeovers"):
        text = column in ("state", "owner")
        # Numbers keep their lines whole; the state (an error) and the owner fold.
        table.add_column(column, overflow="fold", no_wrap=not text,
                         justify="left" if text else "right")
    for v in views:
        table.add_row(str(v.part), f"{v.lo}..{v.hi}\n{v.checkpoint}", _state(v), v.owner or "-",
                      f"{v.rows_done:,}\n{v.rows_per_s:,.0f}/s", f"{v.fence}\n{v.takeovers}")
    return table


def _state(v: PartitionView) -> str:
    if v.status == PartitionStatus.FAILED:
        return f"failed: {v.error}"
    if v.status == PartitionStatus.RUNNING and v.throttled_until is not None:
        wait = (v.throttled_until - utcnow()).total_seconds()
        if wait > 0:
            return f"running, throttled {wait:,.1f}s"
    return v.status


# -- restock ---------------------------------------------------------------------------------

def shards_table(views: Sequence[ShardView], now_ms: int) -> Table:
    """A row per shard and queue: term, maintenance window, queued, due, unsynced log."""
    table = Table(title="restock shards")
    for column in ("shard", "term", "maintenance", "queue", "queued", "due", "unsynced log",
                   "dead letters"):
        table.add_column(column, overflow="fold", justify="left" if column in (
            "maintenance", "queue") else "right")
    for v in views:
        if v.error is not None:
            table.add_row(str(v.shard), "-", f"unreachable: {v.error}", "-", "-", "-", "-",
                          str(v.dead_letters))
            continue
        window = v.window(now_ms)
        for i, queue in enumerate(v.queued):
            first = i == 0
            table.add_row(str(v.shard) if first else "", str(v.term) if first else "",
                          window if first else "", queue, str(v.queued[queue]),
                          str(v.due[queue]), str(v.backlog[queue]),
                          str(v.dead_letters) if first else "")
    return table


# -- dead letters ----------------------------------------------------------------------------

def letters_renderable(view: LettersView) -> RenderableType:
    """`status`'s dead letters: the count per kind, then the newest few."""
    if not view.counts:
        return Text("no dead letters")
    head = Text(f"dead letters: {view.total:,} ("
                + ", ".join(f"{kind}: {n:,}" for kind, n in sorted(view.counts.items())) + ")")
    table = Table(title=f"newest {len(view.recent)} dead letters")
    for column in ("id", "kind", "ref", "created (UTC)", "replayed as", "reason"):
        table.add_column(column, overflow="fold")
    for letter in view.recent:
        table.add_row(str(letter.id), letter.kind, quote_text(letter.ref),
                      f"{letter.created_at:%Y-%m-%d %H:%M:%S}", letter.replay_task_id or "-",
                      quote_text(letter.reason, 120))
    return Group(head, table)


def letters_table(letters: Sequence[Summary]) -> Table:
    """`deadletters list`: the newest letters, without their payloads."""
    table = Table(title=f"newest {len(letters)} dead letters")
    for column in ("id", "kind", "ref", "created (UTC)", "replayed as", "reason"):
        table.add_column(column, overflow="fold", justify="right" if column == "id" else "left")
    for s in letters:
        table.add_row(str(s.id), s.kind, quote_text(s.ref), f"{s.created_at:%Y-%m-%d %H:%M:%S}",
                      s.replay_task_id or "-", quote_text(s.reason, 200))
    return table


# -- status ----------------------------------------------------------------------------------

def status_renderable(page: PartitionPage, summaries: Sequence[JobSummary],
                      nodes: Sequence[ShardView], letters: LettersView, now_ms: int,
                      width: int) -> RenderableType:
    """`python -m tasks status`: the jobs (when any), a page of partitions, the restock shards
    and the dead letters."""
    parts = [jobs_table(summaries)] if summaries else []
    return Group(*parts, page_renderable(page, width), shards_table(nodes, now_ms),
                 letters_renderable(letters))


def watch(console: Console, snapshot: Callable[[], RenderableType], every: float) -> None:
    """Redraw `snapshot()` every `every` seconds in place until Ctrl-C; piped, print one
    snapshot after another (a live display would only show the last)."""
    from rich.live import Live

    def stamped() -> RenderableType:
        return Group(Text(f"status at {utcnow():%Y-%m-%d %H:%M:%S} UTC, every {every:g}s "
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


def with_queues(status: RenderableType, queues: Sequence[dict[str, Any]] | None) -> RenderableType:
    """`status` followed by one line of each queue's backlog (None: the broker did not answer;
    `tasks.worker.backlog`)."""
    if queues is None:
        return Group(status, Text("queues: the broker does not answer"))
    shown = ", ".join(f"{q['name']} {q['messages']}" + (
        f" (oldest {q['oldest_s']:.0f}s)" if q["oldest_s"] is not None else "") for q in queues)
    return Group(status, Text(f"queues: {shown}"))
