"""The console's run page, queue view, dead-letter search and bulk actions, and CSV upload in
a real headless Chromium (issues 21 and 22), driven with Selenium against a real `python -m
tasks console`, a real prefork worker and beat on PostgreSQL: the bulk actions ask for a
confirmation (a real `window.confirm`, answered through Selenium's alert API) naming the
count, and do exactly that; the search box narrows the list; a run that failed shows its
partition's traceback; a queue the worker does not consume shows its backlog; an uploaded CSV
starts a run that finishes.

The worker consumes every platform queue but the default one (`celery`), so tasks sent there
wait and the queue view has a backlog to show. Screenshots go to the test's temporary
directory (their paths are printed), or to PAGES_SCREENSHOTS when set.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import sessionmaker

from tasks.deadletters.store import DeadLetters
from tasks.deadletters.tables import DEAD_LETTERS
from tasks.ranges.tables import RANGE_RUNS
from tests import SAMPLE_MODULES, WORKER_REDIS_URL
from tests import test_console_browser as console_browser
from tests.ranges.cluster import CELERY_BEAT
from tests.support.db import DATABASES, fresh_database
from tests.support.workers import Proc, start_worker, wait_until
from tests.test_console_browser import (
    Stack,
    _chromium_missing,
    _css,
    _flash,
    _log_in,
    _present,
    _wait,
)
from tests.test_console_http import Browserless, console_env, start_console

MODULES = f"{SAMPLE_MODULES},tests.support.visit_jobs,tests.support.control_jobs"
ENV = {"LEASE_TTL": "2", "RECONCILE_INTERVAL": "1"}
UNCONSUMED = "celery"  # the default queue: this module's worker does not consume it

# The Chromium fixture of the console's browser tests, on this module's `stack`.
browser = console_browser.browser


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if reason := _chromium_missing():
        pytest.skip(reason)
    from examples.seed import seed_cm_data
    from examples.tables import CM_DATA
    from tests.support.control_jobs import BOOM
    from tests.support.visit_jobs import recreate

    tmp = tmp_path_factory.mktemp("console-pages-browser")
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    engine = fresh_database(DATABASES["postgresql"])
    recreate(engine)
    seed_cm_data(engine, 400)
    with engine.begin() as conn:
        conn.execute(update(CM_DATA).where(CM_DATA.c.id == 300).values(payload=BOOM))
    (tmp / "flaky").touch()
    env = console_env(tmp / "console.sqlite", **ENV, EXTRA_TASK_MODULES=MODULES,
                      TEST_FLAKY_FILE=str(tmp / "flaky"), VISIT_HOLD_FILE=str(tmp / "hold"),
                      VISIT_HOLD_AFTER="500",
                      DATABASE_URL=engine.url.render_as_string(hide_password=False))
    worker = start_worker(env, 2, "pages-w1", "-Q", "control,ranges,restock")
    beat = Proc(CELERY_BEAT, env, "pages-beat")
    try:
        console, base = start_console(env)
    except BaseException:
        beat.stop()
        worker.stop()
        raise
    shots = Path(os.environ.get("PAGES_SCREENSHOTS") or tmp)
    shots.mkdir(parents=True, exist_ok=True)
    yield Stack(base, engine, env, console, worker, shots)
    console.stop()
    beat.stop()
    worker.stop()
    engine.dispose()


@pytest.fixture(scope="module")
def logged_in(stack: Stack, browser: Any) -> Any:
    _log_in(browser, stack.base)
    return browser


def _shot(driver: Any, stack: Stack, name: str) -> Path:
    path = stack.shots / name
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")
    return path


def _rows(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [r.get_attribute("data-letter") or ""
            for r in driver.find_elements(By.CSS_SELECTOR, "#letters tbody tr[data-letter]")]


def _search(driver: Any, text: str) -> None:
    box = _css(driver, "#letter-search")
    box.clear()
    box.send_keys(text)
    _css(driver, "#btn-search").click()


def _click(driver: Any, button: str) -> None:
    """Clear the flash (so the next answer is this click's), then click."""
    driver.execute_script("document.getElementById('flash').textContent = ''")
    _css(driver, button).click()


def _alert(driver: Any) -> Any:
    from selenium.webdriver.support import expected_conditions as ec

    return _wait(driver, ec.alert_is_present(), "the confirmation dialog", 15)


def _letters(engine: Engine, tag: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return {r.ref: r for r in conn.execute(select(DEAD_LETTERS).where(
            DEAD_LETTERS.c.ref.startswith(tag))).all()}


@pytest.mark.timeout(180)
def test_the_search_box_narrows_the_letters(stack: Stack, logged_in: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    store = DeadLetters(sessionmaker(stack.engine))
    for ref, reason in ((f"{tag}-50%_off", "price rule"), (f"{tag}-50xyoff", "price rule"),
                        (f"{tag}-other", "Timeout talking to the PRICE service")):
        store.add("task", ref, reason, {"task": "devtools.samples.nap", "args": [0.01],
                                         "kwargs": {}})
    ids = {s.ref: str(s.id) for s in store.recent(3)}
    driver = logged_in
    driver.get(f"{stack.base}/deadletters")
    _wait(driver, _present("#letters tbody tr[data-letter]"), "the letters")
    _search(driver, f"{tag}-50%_")
    _wait(driver, lambda d: _rows(d) == [ids[f"{tag}-50%_off"]], "only the literal match")
    assert _css(driver, "#matching").text == "1 letter matches"
    assert f"search={tag}-50%25_" in driver.current_url  # a reload shows the same
    _search(driver, "price")  # the reason, case-insensitively
    _wait(driver, lambda d: set(ids.values()) <= set(_rows(d)), "every price letter")
    _search(driver, tag)
    _wait(driver, lambda d: sorted(_rows(d)) == sorted(ids.values()), "the tag's letters")
    _shot(driver, stack, "letters-search.png")


@pytest.mark.timeout(180)
def test_bulk_replay_and_purge_ask_for_the_count_then_do_exactly_that(
        stack: Stack, logged_in: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    store = DeadLetters(sessionmaker(stack.engine))
    for n in range(3):
        store.add("task", f"{tag}-nap-{n}", "redelivery cap", {
            "task": "devtools.samples.nap", "args": [0.01], "kwargs": {}})
    store.add("task", f"{tag}-head", "too big", {"head": "x"})  # keeps no task
    store.add("task", "another-letter", "redelivery cap", {})  # not matched: kept
    driver = logged_in
    driver.get(f"{stack.base}/deadletters?kind=task&search={tag}")
    _wait(driver, lambda d: len(_rows(d)) == 4, "the four matching letters")
    _shot(driver, stack, "letters-bulk-before.png")

    _click(driver, "#btn-bulk-replay")
    asked = _alert(driver)
    assert asked.text == f"Replay 4 letters of kind task matching '{tag}'?"
    asked.dismiss()  # cancelled: nothing is sent
    _wait(driver, lambda d: "nothing was replayed" in _flash(d), "the cancellation")
    assert all(r.replayed_at is None for r in _letters(stack.engine, tag).values())

    _click(driver, "#btn-bulk-replay")
    _alert(driver).accept()
    _wait(driver, lambda d: _flash(d).startswith("done:"), "the replay's report")
    assert _flash(driver) == (f"done: replayed 3 of 4 letters of kind task matching "
                              f"'{tag}', 1 not replayable")
    shown = _letters(stack.engine, tag)
    assert all(shown[f"{tag}-nap-{n}"].replay_task_id for n in range(3))
    assert shown[f"{tag}-head"].replayed_at is None
    _wait(driver, lambda d: "-" not in [c.text for c in d.find_elements(
        "css selector", "#letters tbody td:nth-child(5)")][1:], "the replays' task ids shown")
    _shot(driver, stack, "letters-bulk-replayed.png")

    _click(driver, "#btn-bulk-purge")
    asked = _alert(driver)
    assert asked.text == f"Purge (delete for good) 4 letters of kind task matching '{tag}'?"
    asked.accept()
    _wait(driver, lambda d: _flash(d).startswith("done:"), "the purge's report")
    assert _flash(driver).startswith("done: purged 4 of 4 letters of kind task matching")
    assert _letters(stack.engine, tag) == {}
    assert _letters(stack.engine, "another-letter")
    _wait(driver, lambda d: "no letter matches" in _css(d, "#letters tbody").text,
          "the emptied list")
    _shot(driver, stack, "letters-bulk-purged.png")


@pytest.mark.timeout(180)
def test_a_failed_run_shows_its_partitions_traceback(stack: Stack, logged_in: Any) -> None:
    operator = Browserless(stack.base)
    assert operator.login().status == 302
    started = operator.request("/api/jobs/cm_flaky/start", {}, {"X-CSRF-Token": operator.csrf()})
    assert started.status == 200, started.body

    def state() -> str | None:
        with stack.engine.connect() as conn:
            return conn.execute(select(RANGE_RUNS.c.state).where(
                RANGE_RUNS.c.job == "cm_flaky")).scalar()

    wait_until(lambda: state() == "failed", 90, "cm_flaky's run to fail")
    driver = logged_in
    driver.get(f"{stack.base}/jobs/cm_flaky/runs/1")
    _wait(driver, _present("#failures pre.traceback"), "the failed partition")
    trace = _css(driver, "#failures pre.traceback").text
    assert trace.startswith("Traceback (most recent call last)") and "_fail_on_boom" in trace
    assert trace.endswith("ValueError: boom")
    assert "part 0 failed at " in _css(driver, "#failures h3").text
    assert _css(driver, "#fact-state").text == "failed"
    assert _css(driver, "#fact-started-by").text.startswith("console:operator@127.0.0.1")
    verbs = _css(driver, "#events tbody").text
    assert "partition-failed" in verbs and "start" in verbs
    driver.execute_script("document.querySelector('#failures').scrollIntoView()")
    _shot(driver, stack, "run-failed-traceback.png")


@pytest.mark.timeout(120)
def test_the_queue_view_shows_a_backlog(stack: Stack, logged_in: Any) -> None:
    from tasks.celery import app

    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.delete(UNCONSUMED)
    try:
        for _ in range(7):
            app.send_task("devtools.samples.nap", args=[0.01], queue=UNCONSUMED)
        driver = logged_in
        driver.get(f"{stack.base}/queues")
        row = f'#queues tr[data-queue="{UNCONSUMED}"]'
        _wait(driver, lambda d: _css(d, row).get_attribute("data-messages") == "7",
              "the backlog of 7")
        # The page polls: the oldest message's age grows without a reload.
        ages = [_age(driver, row)]
        _wait(driver, lambda d: _age(d, row) >= ages[0] + 2, "the oldest message to age")
        assert _css(driver, row).text.startswith(f"{UNCONSUMED} 7 "), _css(driver, row).text
        assert _css(driver, 'nav a[href="/queues"]').get_attribute("aria-current") == "page"
        _shot(driver, stack, "queues.png")
        client.delete(UNCONSUMED)
        _wait(driver, lambda d: _css(d, row).get_attribute("data-messages") == "0",
              "the emptied queue, without a reload")
    finally:
        client.delete(UNCONSUMED)
        client.close()


def _age(driver: Any, row: str) -> int:
    """The oldest message's age the queue row shows, in seconds (`45s`, `1m05s`)."""
    text = _css(driver, f"{row} td:last-child").text
    minutes, _, seconds = text.rstrip("s").rpartition("m")
    return int(minutes or 0) * 60 + int(seconds)


@pytest.mark.timeout(240)
def test_an_uploaded_csv_starts_a_run_that_finishes(stack: Stack, logged_in: Any) -> None:
    from tests.support.visit_jobs import VISIT_EXPORT

    hold = Path(stack.env["VISIT_HOLD_FILE"])
    hold.touch()
    bad = stack.shots / "bad.csv"
    bad.write_text("name,size\na,1\nb,2,3\n")
    good = stack.shots / "people.csv"
    good.write_text("name,size\n" + "".join(f"person-{i},{i % 5}\n" for i in range(1, 1001)))
    driver = logged_in
    driver.get(f"{stack.base}/jobs/csv_copy/upload")
    _wait(driver, _present("#upload-form"), "the upload form")
    _css(driver, "#csv-file").send_keys(str(bad))
    _css(driver, "#btn-upload").click()
    _wait(driver, lambda d: _flash(d).startswith("refused:"), "the refusal")
    assert _flash(driver) == "refused: bad.csv: line 3: 3 fields, but the header has 2"
    with stack.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(RANGE_RUNS).where(
            RANGE_RUNS.c.job == "csv_copy")).scalar() == 0

    _css(driver, "#csv-file").clear()
    _css(driver, "#csv-file").send_keys(str(good))
    _css(driver, "#btn-upload").click()
    _wait(driver, lambda d: _flash(d).startswith("done:"), "the start")
    assert _flash(driver) == "done: run 1 started with 1000 lines"
    _shot(driver, stack, "upload-started.png")
    _css(driver, "#started-run").click()
    # Its second batch (lines 501-1000) is held in flight: the run page shows it midway.
    _wait(driver, lambda d: _css(d, "#progress .big").get_attribute("data-share") == "0.5",
          "the run's bar at half", 90)
    assert _css(driver, "#fact-state").text == "running"
    assert "ETA" in _css(driver, "#progress").text
    _shot(driver, stack, "upload-run-live.png")
    hold.unlink()
    _wait(driver, lambda d: _css(d, "#fact-state").text == "succeeded", "the run to finish", 150)
    assert _css(driver, "#fact-rows-done").text == "1,000"
    with stack.engine.connect() as conn:
        copied = conn.execute(select(func.count(), func.count(VISIT_EXPORT.c.source_id.distinct()))
                              .select_from(VISIT_EXPORT)).one()
    assert tuple(copied) == (1000, 1000)
    _shot(driver, stack, "upload-run-succeeded.png")


@pytest.mark.timeout(120)
def test_these_pages_fit_a_phone_width_screen(stack: Stack, logged_in: Any) -> None:
    """Runs after the tests above, which left a failed run of cm_flaky and a run of
    csv_copy behind."""
    driver = logged_in
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 380, "height": 800, "deviceScaleFactor": 1, "mobile": True})
    try:
        for path, ready in (("/queues", "#queues tr[data-queue]"),
                            ("/deadletters", "#letters tbody tr"),
                            ("/jobs/cm_flaky/runs/1", "#failures pre.traceback"),
                            ("/jobs/csv_copy/runs", "#runs tr[data-run]"),
                            ("/jobs/csv_copy/upload", "#upload-form"),
                            ("/jobs/cm_flaky/runs/1", "#failures pre.traceback")):
            driver.get(stack.base + path)
            _wait(driver, _present(ready), f"{path} filled in")
            wide = driver.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth]")
            assert wide[0] <= wide[1], (path, wide)
        _shot(driver, stack, "run-phone.png")
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
