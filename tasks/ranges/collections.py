"""Collections: range jobs over something other than a table of your own.

    imports = register(csv_job(name="import_users", process=create_users, batch_size=500))
    # python -m tasks jobs start import_users --csv users.csv
    # process(rows, ctx): rows are CsvRow(line, values): values is {header: field}

    feed = register(collection_job(name="sync_feed", pages=fetch_page, process=send_items))
    # fetch_page(cursor, size) -> (items, cursor after them); None in, None out at the end

Both are visit-once jobs (`tasks.ranges.visits`): no filter of rows still to do, every item
visited by exactly one committed batch per run, `ctx.idempotency_key(item)` for effects
outside the database.

A CSV job: the file is read and checked whole when the run starts (UTF-8, a header line of
distinct names, then records with as many fields as the header; RFC 4180 quoting). A bad record
refuses the start with one line naming the file's line, and nothing is written. Otherwise its
records are stored as the run's input, `range_run_input` (run, line, payload: the record as a
JSON object), in the start's transaction, so every worker reads the same rows whatever happens
to the file. The job then runs as a visit-once job over that table, scoped to its run:
partitions are ranges of line numbers under the same leases, fences and checkpoints as any
table. `line` counts records from 1 (the first after the header; blank lines are no records). A
run's input is deleted by the job's next start.

A custom collection (`collection_job`): `pages(cursor, size)` returns the items after
`cursor` (None: from the start), about `size` of them, and the cursor after them (None: no
more). The run is one partition; each page is one batch: one transaction in which the guard
moves the partition's cursor (`work_items.collection_cursor`, JSON text) and `process` runs
on the page's items. A holder that dies mid-page leaves the cursor where the last committed
page put it, so the next holder asks for the same page again: the source must answer the
same cursor with the same items (a keyset or snapshot cursor, not an offset into a list that
changes), and effects outside the database use `ctx.idempotency_key(item_key)`.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from tasks.ranges.jobs import CSV_INPUT, Context, PagesFn, RangeJob, Visits
from tasks.ranges.planning import Partition
from tasks.ranges.tables import RANGE_RUNS, RUN_INPUT
from tasks.ranges.workrow import WorkRow
from tasks.store.db import WRITE_INTENT
from tasks.store.validate import InvalidArguments

__all__ = ["CsvRow", "BadInput", "csv_job", "collection_job", "read_csv", "parse_csv",
           "store_input", "PageBatches", "MAX_LINES", "COLLECTION_PARTITION"]

MAX_LINES = 5_000_000  # records of one CSV (they are held in memory while the start checks them)
INSERT_CHUNK = 1000  # records per INSERT of a run's input
# The one partition of a custom collection (its bounds mean nothing: its place is its cursor).
COLLECTION_PARTITION = Partition(0, 1, 1)

CsvProcess = Callable[[Sequence["CsvRow"], Context], None]


class BadInput(InvalidArguments):
    """A CSV that cannot be a run's input; the message names the file and the line."""


class CsvRow(NamedTuple):
    """One record of a CSV job's input: its number (1: the first after the header) and its
    fields by the header's names."""

    line: int
    values: dict[str, str]


def csv_job(name: str, process: CsvProcess, **options: Any) -> RangeJob:
    """A visit-once job over the CSV given at each start (`jobs start NAME --csv PATH`);
    `process(rows, ctx)` gets `CsvRow`s. `options` are RangeJob's (batch_size,
    partition_size in lines, parallelism, rows_per_s, skip_on...)."""

    def run(rows: Sequence[Any], ctx: Context) -> None:
        process([CsvRow(int(r.line), json.loads(r.payload)) for r in rows], ctx)

    options.setdefault("partition_size", 10_000)
    return RangeJob(name=name, table=RUN_INPUT, id_column="line", columns=("line", "payload"),
                    process=run, visits=Visits.ONCE, input=CSV_INPUT, **options)


def collection_job(name: str, pages: PagesFn, process: Callable[[Sequence[Any], Context], None],
                   **options: Any) -> RangeJob:
    """A visit-once job over the items `pages` returns, one page per batch (`batch_size` is
    the size asked for), as one partition whose checkpoint is the page's cursor. Options
    that read a table in batches of their own (adaptive batches, `fetch_size`, a skip
    policy, `where`, `columns`) are refused."""
    table_only = sorted({"target_batch_s", "fetch_size", "skip_on", "where", "columns",
                         "id_column", "table"} & set(options))
    if table_only:
        raise ValueError(f"range job {name}: {table_only[0]} applies to a table's rows, not "
                         "to a collection's pages")
    return RangeJob(name=name, table=RUN_INPUT, id_column="line", process=process,
                    visits=Visits.ONCE, pages=pages, **options)


def read_csv(path: str, max_lines: int = MAX_LINES) -> list[str]:
    """The records of the CSV file `path` as JSON objects keyed by its header; `BadInput`
    naming the line of the first bad record (or an unreadable file), having read only."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise BadInput(f"--csv {path}: cannot read it ({exc.strerror or exc})") from None
    return parse_csv(data, path, max_lines)


def parse_csv(data: bytes, name: str, max_lines: int = MAX_LINES) -> list[str]:
    """The records of CSV text `data` (a file's bytes, or an upload's: `name` says which in
    the messages) as `read_csv` returns them, with its checks."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise BadInput(f"{name}: line {line}: not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        return _records(name, reader, max_lines)
    except csv.Error as exc:
        raise BadInput(f"{name}: line {reader.line_num}: {exc}") from None


def _records(path: str, reader: Any, max_lines: int) -> list[str]:
    header = next(reader, None)
    if not header:
        raise BadInput(f"{path}: line 1: a header line (the names of the fields) is required")
    names = [h.strip() for h in header]
    if not all(names):
        raise BadInput(f"{path}: line 1: the header has an empty name (field "
                       f"{names.index('') + 1})")
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise BadInput(f"{path}: line 1: the header names {doubled[0]!r} twice")
    found: list[str] = []
    for record in reader:
        if not record:
            continue  # a blank line is no record
        if len(record) != len(names):
            raise BadInput(f"{path}: line {reader.line_num}: {len(record)} fields, but the "
                           f"header has {len(names)}")
        if len(found) >= max_lines:
            raise BadInput(f"{path}: line {reader.line_num}: more than {max_lines} records")
        found.append(json.dumps(dict(zip(names, record, strict=True))))
    return found


def store_input(session: Session, job: str, run: int, records: Sequence[str]) -> None:
    """Store `records` as run `run`'s input, in the caller's (the start's) transaction; the
    job's earlier runs' input goes."""
    earlier = select(RANGE_RUNS.c.id).where(RANGE_RUNS.c.job == job, RANGE_RUNS.c.id != run)
    session.execute(delete(RUN_INPUT).where(RUN_INPUT.c.run.in_(earlier)))
    for at in range(0, len(records), INSERT_CHUNK):
        session.execute(insert(RUN_INPUT), [
            {"run": run, "line": at + i + 1, "payload": payload}
            for i, payload in enumerate(records[at:at + INSERT_CHUNK])])


class PageBatches:
    """The batches of a custom collection's one partition: a page each, from the stored
    cursor (`cursor`, JSON text; None: the start). The same face as `Batches` for the
    runner: `step`, `size`, `rows_done`, `started`, `partition`."""

    def __init__(self, row: WorkRow, partition: Partition, *, cursor: str | None,
                 clock: Callable[[], float] = time.monotonic, params: Any = None,
                 run: int | None = None) -> None:
        self.row, self.job, self.partition = row, row.job, partition
        assert self.job.pages is not None
        self.pages: PagesFn = self.job.pages
        self.cursor: Any = json.loads(cursor) if cursor is not None else None
        self.clock, self.started = clock, clock()
        self.params, self.run = params, run
        self.rows_done = 0

    @property
    def size(self) -> int:
        """Items the next page holds at most."""
        return self.job.batch_size

    def step(self, fence: int, pool: ThreadPoolExecutor | None) -> int | str:
        """Read the next page (outside the transaction: a network call), then in one
        transaction: the guard moves the cursor past it, `process` runs on its items, and
        the partition is done if it was the last. Returns the items done so far, or the
        partition's final status. `FencedOut` if a newer holder owns the partition."""
        items, after = self.pages(self.cursor, self.job.batch_size)
        items = list(items)
        try:
            stored = None if after is None else json.dumps(after)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"range job {self.job.name}: the cursor after a page must be "
                            f"JSON (a number, a string, a list or an object): {exc}") from None
        final = None
        with self.row.sessions.begin() as session:
            conn = session.connection(execution_options=WRITE_INTENT)
            rate = (self.rows_done + len(items)) / max(self.clock() - self.started, 1e-6)
            self.row.move_cursor(conn, fence, stored, len(items), rate)
            if items:
                self.job.process(items, Context(session, fence, self.job, self.partition,
                                                pool, None, self.params, self.run))
            if after is None:
                final = self.row.finish(conn, fence, self.partition.hi + 1)
        self.cursor = after
        self.rows_done += len(items)
        return final if final is not None else self.rows_done
