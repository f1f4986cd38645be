"""Declaring range jobs: what table to walk, which rows, and what to do with each batch.

    orders = RangeJob(                 # your table, on your own MetaData (examples/cm_data.py)
        name="archive_orders",
        table=ORDERS,
        where=ORDERS.c.archived == 0,
        process=mark_processed,        # (rows, ctx) -> None; writes through ctx.session
        batch_size=1000,
        parallelism=4,                 # ctx.map(fn, rows) runs fn on 4 threads
        params=ArchiveParams,          # optional: a dataclass of run parameters (ctx.params)
    )
    register(orders)

    register(RangeJob(name="export_orders", table=ORDERS, visits="once", process=send_rows))

The process function runs inside the batch's transaction: its writes commit together with the
partition's checkpoint, guarded by the lease's fence, or not at all. With `fetch_size` it is
called once per read of that many rows, several times in one batch's transaction.

Two kinds of job, by what they promise (README, "Which rows a run processes"):

- A filter job (the default, `visits="filter"`): `where` is required and is the filter of rows
  *still to do*: processing a row must make it stop matching (cm_data sets `status = 1`). A
  partition is done only when a closing read of its whole id range with this filter finds
  nothing, which is how rows committed out of id order are found. The runner checks the
  contract on the first batch of every run: a process function that leaves a row matching
  fails its partition, writing nothing.
- A visit-once job (`visits="once"`: an export, a reindex, a notification, a cache warm-up)
  changes nothing that a filter could see. `where` is optional and only selects rows; the
  run's plan is made once, and every row present then is visited exactly once by a committed
  batch; a partition is done when its cursor reached its upper bound (`tasks.ranges.visits`).
  Effects outside the database carry `ctx.idempotency_key(row)`: (job, run, row key), the
  same when a batch is retried, new in the next run.

The key (`tasks.ranges.jobkeys`): `id_column` names one column, `key` a tuple of them in key
order (`key=("created_at", "id")`); integer, string, UUID, date and datetime columns, unique
and NOT NULL. One integer column is walked by id range as above; any other key by keyset
(`key > :cursor`), in partitions cut by row count (`partition_by="rows"`, also available for
an integer key on a skewed id space).

Run parameters (`tasks.ranges.params`): `params` is a dataclass class whose instance, built
from the values given at start and stored on the run, reaches `process` as `ctx.params`.
`where` may then be a function of it, `where=lambda p: ORDERS.c.tenant == p.tenant`, called
once per partition run and once per closing round with the run's parameters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Row, Table, true
from sqlalchemy.sql import ClauseElement

from tasks.ranges.context import Context
from tasks.ranges.cron import parse_cron, validate_missed, validate_policy
from tasks.ranges.hooks import HOOKS, Hook, validate_hook
from tasks.ranges.jobkeys import JobKey, key_of_job
from tasks.ranges.keys import range_lease_name
from tasks.ranges.params import InvalidParams, build, decode, encode, fields_of
from tasks.ranges.sizing import validate_sizing
from tasks.ranges.skips import validate_skips
from tasks.store.validate import INT32_MAX, InvalidArguments, int_arg, quote, text_arg

__all__ = ["RangeJob", "Context", "Visits", "CSV_INPUT", "UnknownJob", "InvalidArguments",
           "register", "get_job", "registered_jobs", "validate_job_name", "validate_part"]


ProcessFn = Callable[[Sequence[Row[Any]], "Context"], None]
# A custom collection's source (tasks.ranges.collections): (cursor, size) -> (items, cursor
# after them); the first call gets None, the last returns None as its cursor.
PagesFn = Callable[[Any, int], tuple[Sequence[Any], Any]]
# The filter of rows still to do: a clause, or a function of the run's parameters.
Where = ColumnElement[bool] | Callable[[Any], ColumnElement[bool]]

JOB_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
CSV_INPUT = "csv"  # RangeJob.input of a CSV job


class Visits:
    """What a job promises about the rows it visits (`RangeJob.visits`)."""

    FILTER = "filter"  # rows matching `where` until they stop matching; the closing round
    ONCE = "once"  # every row present when the run's plan was made, once; no closing read

    ALL = (FILTER, ONCE)


class UnknownJob(InvalidArguments):
    """No range job of that name is registered."""


@dataclass(frozen=True)
class RangeJob:
    """A job that walks `table` in partitions of its key, batch by batch, exactly once."""

    name: str
    table: Table
    process: ProcessFn
    # The filter of rows still to do (a filter job); for a visit-once job, an optional
    # selection of the rows to visit.
    where: Where | None = None
    id_column: str = "id"
    partition_size: int = 2_000_000
    batch_size: int = 1000
    parallelism: int = 1
    columns: tuple[str, ...] = field(default=())
    # Range-job controls (tasks.ranges.gate): a cluster-wide cap in rows per second
    # each run starts with (`tasks.ranges.throttle` changes it), and a callable asked before
    # each batch whose truthy answer (e.g. replication lag too high) makes the run wait.
    rows_per_s: float | None = None
    throttle_on: Callable[[RangeJob], object] | None = None
    # Adaptive batches (tasks.ranges.sizing): with `target_batch_s` the batch size starts at
    # `batch_size` and moves between the bounds to hold that time per batch.
    target_batch_s: float | None = None
    min_batch_size: int = 1
    max_batch_size: int = 100_000
    # Rows per read inside a batch (None: the whole batch at once). A batch stays one
    # transaction and one checkpoint; it is read, and `process` called, `fetch_size` rows at
    # a time, so a big batch costs per row what a small one does (rows a few thousand at a
    # time stay in the CPU's caches) while its transaction, guard and gate are paid once.
    fetch_size: int | None = None
    # Skip policy (tasks.ranges.skips): a row whose processing raises one of `skip_on` is
    # quarantined as a dead letter and the batch goes on without it, up to `skip_limit` rows
    # per partition; past that the partition fails.
    skip_on: tuple[type[Exception], ...] = ()
    skip_limit: int = 0
    # Follow the table (tasks.ranges.closing): where its run would succeed it becomes
    # `following` and keeps processing rows that come to match until it is cancelled.
    follow: bool = False
    # Run parameters (tasks.ranges.params): a dataclass class; None: the job takes none.
    params: type | None = None
    # Hooks (tasks.ranges.hooks), run once per run end: a callable, called with the run's
    # summary, or a Celery signature (a task name, or a signature's dict form) sent with it.
    on_success: Hook | None = field(default=None, compare=False)
    on_failure: Hook | None = field(default=None, compare=False)
    on_cancel: Hook | None = field(default=None, compare=False)
    # A cron schedule (tasks.ranges.cron, UTC; six fields: seconds first) with its
    # concurrency policy (skip, replace, queue) and missed-run policy (once, skip); the
    # leader beat starts its runs, and `jobs schedule` changes it at runtime.
    schedule: str | None = None
    schedule_policy: str = "skip"
    schedule_missed: str = "once"
    # What the job promises (`Visits`): "filter" (rows matching `where` until processing
    # makes them stop) or "once" (every row present when the run's plan was made, once).
    visits: str = Visits.FILTER
    # Collections (tasks.ranges.collections; made by `csv_job` and `collection_job`, not by
    # hand): `input="csv"` walks the run's input (the lines of a CSV given at start, stored
    # in `range_run_input`); `pages` reads a resumable source a page at a time, as one
    # partition whose checkpoint is the page's cursor.
    input: str | None = None
    pages: PagesFn | None = None
    # The key the job walks (tasks.ranges.jobkeys): column names in key order, e.g.
    # ("created_at", "id"); None: `id_column` alone. One integer column keeps id-span
    # partitions unless `partition_by="rows"`; any other key is cut by row count.
    key: tuple[str, ...] | str | None = None
    # How partitions are cut: "ids" (`partition_size` ids each; integer keys only) or "rows"
    # (about `partition_size` rows each, from a walk of the key's index). None: "ids" for an
    # integer key, "rows" for any other.
    partition_by: str | None = None
    keyset: JobKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_job_name(self.name)
        self._check_hooks_and_schedule()
        self._check_visits()
        self._check_params()
        for attr in ("partition_size", "batch_size", "parallelism"):
            if getattr(self, attr) <= 0:
                raise ValueError(f"range job {self.name}: {attr} must be positive")
        if self.fetch_size is not None and self.fetch_size <= 0:
            raise ValueError(f"range job {self.name}: fetch_size must be positive (or None)")
        validate_sizing(self.name, self.target_batch_s, self.min_batch_size,
                        self.max_batch_size)
        validate_skips(self.name, self.skip_on, self.skip_limit)
        if self.rows_per_s is not None and not 0 <= self.rows_per_s < float("inf"):
            raise ValueError(f"range job {self.name}: rows_per_s must be a finite number >= 0")
        self._check_key()

    def _check_key(self) -> None:
        names = self.key if self.key is not None else (self.id_column,)
        if isinstance(names, str):
            names = (names,)
        if not isinstance(names, tuple):
            raise ValueError(f"range job {self.name}: key must be a tuple of column names, "
                             f"got {names!r}")
        # A collection reads one run's input at a time: `line` is unique within its run.
        scoped = (frozenset({"run"}) if self.input == CSV_INPUT or self.pages is not None
                  else frozenset())
        keyset = key_of_job(self.name, self.table, names, scoped)
        object.__setattr__(self, "keyset", keyset)
        object.__setattr__(self, "id_column", keyset.names[0])
        by = self.partition_by or ("ids" if keyset.integer else "rows")
        if by not in ("ids", "rows"):
            raise ValueError(f"range job {self.name}: partition_by must be 'ids' or 'rows', "
                             f"got {by!r}")
        if by == "ids" and not keyset.integer:
            raise ValueError(f"range job {self.name}: key {', '.join(keyset.names)} is not one "
                             "integer column, so its partitions are cut by rows "
                             "(partition_by='rows'), not by ids")
        for column in self.columns:
            if column not in self.table.c:
                raise ValueError(f"range job {self.name}: table {self.table.name} has no "
                                 f"column {column!r}")
        missing = [n for n in keyset.names if self.columns and n not in self.columns]
        if missing:
            what = "id" if keyset.integer else "key"
            raise ValueError(f"range job {self.name}: columns must include the {what} column "
                             f"{missing[0]!r} (the runner keeps its place by it)")
        if not keyset.integer and self.skip_on:
            raise ValueError(f"range job {self.name}: a skip policy (skip_on) needs an integer "
                             "key; a keyed job's bad row fails its partition")
        if not keyset.integer and self.visits == Visits.ONCE:
            raise ValueError(f"range job {self.name}: visits=\"once\" needs an integer key "
                             "(its plan is one read of the key's bounds); a keyed job visits "
                             "by its filter")

    @property
    def keyed(self) -> bool:
        """The job walks a key that is not one integer column (tasks.ranges.jobkeys)."""
        return not self.keyset.integer

    @property
    def by_rows(self) -> bool:
        """Partitions are cut by row count (a keyed job's always are)."""
        return self.keyed or self.partition_by == "rows"

    def _check_hooks_and_schedule(self) -> None:
        for attr in HOOKS.values():
            object.__setattr__(self, attr, validate_hook(self.name, attr, getattr(self, attr)))
        try:
            if self.schedule is not None:
                object.__setattr__(self, "schedule", parse_cron(self.schedule).expr)
            validate_policy(self.schedule_policy)
            validate_missed(self.schedule_missed)
        except InvalidArguments as exc:
            raise ValueError(f"range job {self.name}: {exc}") from None

    def hook_for(self, state: str) -> Any:
        """The hook of a run that ended in `state` (a callable or a Signature), or None."""
        attr = HOOKS.get(state)
        return getattr(self, attr) if attr is not None else None

    def _check_visits(self) -> None:
        if self.visits not in Visits.ALL:
            raise ValueError(f"range job {self.name}: visits must be one of "
                             f"{', '.join(Visits.ALL)}, not {self.visits!r}")
        if self.where is None and self.visits == Visits.FILTER:
            raise ValueError(f"range job {self.name}: `where` (the filter of rows still to do) "
                             "is required, or declare visits=\"once\" for a job that only "
                             "reads (an export, external effects); see tasks/ranges/jobs.py")
        if (self.input is not None or self.pages is not None) and self.visits != Visits.ONCE:
            raise ValueError(f"range job {self.name}: a collection is visited once: make it "
                             "with tasks.ranges.collections (csv_job, collection_job)")
        if self.input is not None and (self.input != CSV_INPUT or "run" not in self.table.c):
            raise ValueError(f"range job {self.name}: input must be {CSV_INPUT!r} over the "
                             "run-input table (tasks.ranges.collections.csv_job)")
        if self.follow and self.visits == Visits.ONCE:
            raise ValueError(f"range job {self.name}: follow=True needs a filter of rows "
                             "still to do; a visits=\"once\" job visits its plan and ends")

    def run_scope(self, run: int | None) -> ColumnElement[bool] | None:
        """The rows of run `run` in the job's table: a CSV job's run input (None: the job
        walks its whole table)."""
        if self.input != CSV_INPUT:
            return None
        return self.table.c.run == (run if run is not None else -1)

    @property
    def visits_once(self) -> bool:
        """The job visits each row of its run's plan once (no filter contract, no closing
        read)."""
        return self.visits == Visits.ONCE

    def _check_params(self) -> None:
        if self.params is not None:
            try:
                fields_of(self.params)
            except ValueError as exc:
                raise ValueError(f"range job {self.name}: {exc}") from None
        if self.where is not None and not isinstance(self.where, ClauseElement):
            if not callable(self.where):
                raise ValueError(f"range job {self.name}: `where` must be a SQLAlchemy clause "
                                 "or a function of the run's parameters")
            if self.params is None:
                raise ValueError(f"range job {self.name}: a `where` function needs params= "
                                 "(the dataclass of the run parameters it is called with)")

    def filter(self, params: Any = None) -> ColumnElement[bool]:
        """The filter of rows still to do for a run with parameters `params` (a visit-once
        job: its selection, every row without one)."""
        if self.where is None:
            return true()
        if isinstance(self.where, ClauseElement):
            return self.where
        found = self.where(params)
        if not isinstance(found, ClauseElement):
            raise InvalidParams(f"{self.name}: where(params) returned {type(found).__name__}, "
                                "not a SQLAlchemy clause")
        return found

    def make_params(self, given: object) -> tuple[Any, str | None]:
        """The run parameters from `given` (a mapping of names to text or JSON values; None:
        none given), checked against the job's filter, and their stored form; `InvalidParams`
        for anything refused, before anything is written."""
        if self.params is None:
            if given:
                raise InvalidParams(f"{self.name} takes no parameters")
            return None, None
        params = build(self.name, self.params, {} if given is None else given)
        try:
            self.filter(params)
        except InvalidParams:
            raise
        except Exception as exc:  # the job's own function: its error is the refusal
            raise InvalidParams(f"{self.name}: where(params) failed: {type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:200]}") from None
        return params, encode(params)

    def params_of(self, stored: str | None) -> Any:
        """The instance of a run's stored parameters (None if the job declares none)."""
        return decode(self.name, self.params, stored)

    @property
    def id_col(self) -> Any:
        """The key's first column (an integer key's only column)."""
        return self.table.c[self.id_column]

    def lease_name(self, part: int) -> str:
        return range_lease_name(self.name, part)


_JOBS: dict[str, RangeJob] = {}


def register(job: RangeJob) -> RangeJob:
    """Make `job` known to workers, the reconciler and `tasks.ranges.start`."""
    existing = _JOBS.get(job.name)
    if existing is not None and existing is not job:
        raise ValueError(f"range job {job.name} is already registered")
    _JOBS[job.name] = job
    return job


def validate_job_name(name: object) -> str:
    """`name` if it is a job name; `InvalidArguments` quoting at most a short prefix otherwise."""
    text_arg("job", name, max_len=64)
    assert isinstance(name, str)
    if not JOB_NAME.match(name):
        raise InvalidArguments(f"job name {quote(name)} must match {JOB_NAME.pattern}")
    return name


def validate_part(part: object) -> int:
    """A partition number that fits the work table's integer column."""
    return int_arg("partition", part, lo=0, hi=INT32_MAX)


def get_job(name: object) -> RangeJob:
    """The registered job called `name`; `UnknownJob` names the known ones otherwise."""
    validate_job_name(name)
    assert isinstance(name, str)
    try:
        return _JOBS[name]
    except KeyError:
        known = ", ".join(sorted(_JOBS)) or "none"
        raise UnknownJob(f"unknown range job {quote(name)} (known: {known})") from None


def registered_jobs() -> list[RangeJob]:
    return [_JOBS[name] for name in sorted(_JOBS)]
