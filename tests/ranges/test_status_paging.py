"""The range status view at 10,000 partitions (issue 20), on SQLite, PostgreSQL and MariaDB:
totals per job and state come from one aggregate query and match the partitions one by one;
a page holds at most its limit; walking the pages forwards (and back) lists every matching
partition exactly once; the filters (state, owner, slowest) return only what matches; a bad
filter or cursor is refused with one line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from tasks.ranges.paging import (
    MAX_LIMIT,
    InvalidPage,
    PartitionPage,
    PartitionQuery,
    partition_page,
)
from tasks.ranges.status import job_summaries, partitions, summarize
from tests.support.planted import owner_of, plant, rate_of, state_of

BIG, SMALL = "big_job", "a_small_job"
COUNT = 10_000


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mariadb"])
def planted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[sessionmaker[Session]]:
    """10,000 partitions of BIG and 15 of SMALL (which sorts first), planted once per
    database for every test of this module (they only read)."""
    from tests.support.db import database_url, fresh_database

    engine: Engine = fresh_database(database_url(request.param, tmp_path_factory.mktemp("db")))
    plant(engine, BIG, COUNT)
    plant(engine, SMALL, 15)
    yield sessionmaker(engine)
    engine.dispose()


def _walk(sessions: sessionmaker[Session], query: PartitionQuery) -> list[PartitionPage]:
    """Every page from `query`'s, following `next`."""
    pages = [partition_page(sessions, query)]
    while pages[-1].next is not None:
        assert len(pages) <= COUNT, "the pages never end"
        pages.append(partition_page(sessions, replace(query, after=pages[-1].next)))
    return pages


def _keys(pages: list[PartitionPage]) -> list[tuple[str, int]]:
    return [(v.job, v.part) for page in pages for v in page.partitions]


def test_totals_per_job_and_state_are_aggregated_and_match_the_partitions(
    planted: sessionmaker[Session],
) -> None:
    small, big = job_summaries(planted)
    assert (small.job, big.job) == (SMALL, BIG)
    assert big.partitions == {"done": 6000, "failed": 1000, "paused": 1000, "pending": 1000,
                              "running": 1000}
    assert {s: t.partitions for s, t in big.states.items()} == big.partitions
    assert big.states["running"].rows_done == 50 * 1000
    assert big.states["running"].rows_per_s == pytest.approx(
        sum(rate_of(p) for p in range(COUNT) if state_of(p) == "running"))
    assert big.states["done"].rows_per_s == 0.0  # a finished partition's last rate is no rate
    assert big.ids_planned == COUNT * 100 and big.eta_s is not None and big.eta_s > 0
    # The SQL totals are the ones added up partition by partition (the pure `summarize`).
    [reference] = summarize(partitions(planted, BIG))
    assert big.states == reference.states and big.ids_walked == reference.ids_walked
    assert big.eta_s == pytest.approx(reference.eta_s)
    assert job_summaries(planted, SMALL) == [small] and job_summaries(planted, "nope") == []


def test_walking_the_pages_lists_every_partition_once(planted: sessionmaker[Session]) -> None:
    pages = _walk(planted, PartitionQuery(limit=MAX_LIMIT))
    keys = _keys(pages)
    assert all(len(p.partitions) <= MAX_LIMIT for p in pages)
    assert all(p.total == COUNT + 15 for p in pages)
    assert len(keys) == len(set(keys)) == COUNT + 15
    assert keys[:15] == [(SMALL, p) for p in range(15)]  # by job, then part
    assert keys[15:] == [(BIG, p) for p in range(COUNT)]
    assert pages[0].prev is None and pages[1].prev == "" and pages[-1].next is None
    # Back from the last page by `prev`: the same pages, in reverse.
    back = [pages[-1]]
    while back[-1].prev is not None:
        back.append(partition_page(planted, PartitionQuery(limit=MAX_LIMIT,
                                                           after=back[-1].prev)))
    assert [_keys([p]) for p in reversed(back)] == [_keys([p]) for p in pages]


@pytest.mark.parametrize(("states", "owner"), [
    (("failed",), None), (("running", "paused"), None), ((), "w1@host"),
    (("running",), "w2@host:1003"), ((), "nobody%"),
])
def test_filters_return_only_what_matches_every_page(
    planted: sessionmaker[Session], states: tuple[str, ...], owner: str | None,
) -> None:
    query = PartitionQuery(job=BIG, states=states, owner=owner, limit=137)
    expected = [(BIG, p) for p in range(COUNT)
                if (not states or state_of(p) in states)
                and (owner is None or (owner_of(p) or "").startswith(owner))]
    pages = _walk(planted, query)
    assert _keys(pages) == expected
    assert all(p.total == len(expected) and len(p.partitions) <= 137 for p in pages)


def test_slowest_lists_running_partitions_lowest_rate_first(
    planted: sessionmaker[Session],
) -> None:
    pages = _walk(planted, PartitionQuery(job=BIG, slowest=True, limit=300))
    views = [v for page in pages for v in page.partitions]
    assert pages[0].total == 1000 and len(views) == 1000
    assert {v.part for v in views} == {p for p in range(COUNT) if state_of(p) == "running"}
    rates = [v.rows_per_s for v in views]
    assert rates == sorted(rates) and rates[0] == pytest.approx(
        min(rate_of(p) for p in range(COUNT) if state_of(p) == "running"))
    assert [p.next for p in pages] == ["300", "600", "900", None]
    assert [p.prev for p in pages] == [None, "", "300", "600"]


@pytest.mark.parametrize(("args", "says"), [
    ({"limit": "0"}, "limit must be from 1 to 500, not 0"),
    ({"limit": "501"}, "limit must be from 1 to 500, not 501"),
    ({"limit": "ten"}, "limit must be a whole number from 1 to 500, not 'ten'"),
    ({"states": ["bogus"]}, "unknown partition state 'bogus'"),
    ({"states": ["failed"], "slowest": True}, "slowest lists running partitions"),
    ({"after": "big_job"}, "the cursor is JOB:PART"),
    ({"after": "big_job:-1"}, "the cursor is JOB:PART"),
    ({"after": "x" * 500}, "the cursor is JOB:PART"),
    ({"after": "big_job:3", "slowest": "1"}, "with slowest the cursor is the number"),
    ({"slowest": "maybe"}, "slowest must be 1 or 0"),
    ({"owner": "o" * 256}, "owner must be at most 255 characters"),
])
def test_a_bad_filter_or_cursor_is_refused_in_one_line(args: dict[str, object],
                                                       says: str) -> None:
    with pytest.raises(InvalidPage) as refused:
        PartitionQuery.parse(**args)  # type: ignore[arg-type]
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert len(str(refused.value)) < 200


def test_text_values_become_a_query() -> None:
    assert PartitionQuery.parse("j", ["failed,paused", "failed", ""], "", "", "7", "j:3") == \
        PartitionQuery("j", ("failed", "paused"), None, False, 7, "j:3")
    assert PartitionQuery.parse("j", ["running"], "w1", "yes", "", "40") == \
        PartitionQuery("j", ("running",), "w1", True, 50, "40")
    assert PartitionQuery.parse(None, [], None, "0", None, None) == PartitionQuery()
    assert PartitionQuery.parse(after="") == PartitionQuery()


def test_an_empty_database_has_no_jobs_and_an_empty_page(tmp_path: Path) -> None:
    from tests.support.db import fresh_database

    engine = fresh_database(f"sqlite:///{tmp_path}/e.sqlite")
    sessions = sessionmaker(engine)
    page = partition_page(sessions, PartitionQuery())
    assert (page.partitions, page.total, page.next, page.prev) == ([], 0, None, None)
    assert job_summaries(sessions) == []
    engine.dispose()
