"""The operator console in a real headless Chromium (issue 12), driven with Selenium against a
real `python -m tasks console`, a real prefork worker and a small cm_data job on PostgreSQL
that runs for a few seconds (CM_DATA_BATCH_DELAY): log in, start the job, watch its bar move,
pause and see every open partition paused in the database, resume, replay a dead letter; at
phone width no page scrolls sideways.

One console, one worker and one job for the whole module. The screenshot of the job page
mid-run goes to CONSOLE_SCREENSHOT (the README's is docs/console.png:
`CONSOLE_SCREENSHOT=docs/console.png pytest tests/test_console_browser.py`), else to the
test's temporary directory; its path is printed. Skips only where Debian's chromium or
chromium-driver is not installed.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, select

from tasks.ranges.tables import RANGE_RUNS, WORK
from tests import WORKER_REDIS_URL
from tests.support.db import DATABASES, fresh_database
from tests.support.workers import Proc, start_worker, wait_until
from tests.test_console_http import PASSWORD, USER, console_env, start_console

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ROWS = 2000  # 4 partitions of 500 rows, 25 batches of 20 each, 0.3 s per batch
JOB_ENV = {"CM_DATA_PARTITION_SIZE": "500", "CM_DATA_BATCH_SIZE": "20",
           "CM_DATA_BATCH_DELAY": "0.3", "CM_DATA_PARALLELISM": "1", "LEASE_TTL": "2",
           "RECONCILE_INTERVAL": "1"}


def _chromium_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(os.path.basename(path))):
            return f"{path} is not installed (Debian: apt-get install chromium chromium-driver)"
    return None


@dataclass
class Stack:
    base: str
    engine: Engine
    env: dict[str, str]
    console: Proc
    worker: Proc
    shots: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if reason := _chromium_missing():
        pytest.skip(reason)
    from examples.seed import seed_cm_data
    tmp = tmp_path_factory.mktemp("console-browser")
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    client.flushdb()
    client.close()
    # PostgreSQL: on SQLite a batch holds the one write lock through its CM_DATA_BATCH_DELAY
    # and takes it again at once, so a control (or a second holder) waits for the partition.
    engine = fresh_database(DATABASES["postgresql"])
    env = console_env(tmp / "console.sqlite", **JOB_ENV,
                      DATABASE_URL=engine.url.render_as_string(hide_password=False))
    seed_cm_data(engine, ROWS)
    worker = start_worker(env, 2, "console-w1")
    try:
        console, base = start_console(env)
    except BaseException:
        worker.stop()
        raise
    yield Stack(base, engine, env, console, worker, tmp)
    console.stop()
    worker.stop()
    engine.dispose()


def chromium() -> Any:
    """A headless Chromium driven by Selenium (1280x1000); the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-dev-shm-usage",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or CHROMEDRIVER),
                              options=options)
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Any]:
    driver = chromium()
    yield driver
    driver.quit()


def _wait(driver: Any, condition: Any, what: str, timeout: float = 30) -> Any:
    """Wait for `condition`; an element the page re-rendered while it was read (stale) or has
    not drawn yet is read again at the next poll."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException)).until(condition, what)


def _css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def _present(selector: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return ec.presence_of_element_located((By.CSS_SELECTOR, selector))


def _statuses(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(WORK.c.status).where(
            WORK.c.kind == "range", WORK.c.job == "cm_data").order_by(WORK.c.part)).scalars())


def _run_state(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(RANGE_RUNS.c.state).where(RANGE_RUNS.c.job == "cm_data")
                            .order_by(RANGE_RUNS.c.id.desc()).limit(1)).scalar()


def _flash(driver: Any) -> str:
    return str(_css(driver, "#flash").text)


def _press(driver: Any, button: str) -> None:
    """Click a control and wait for the console's answer to it."""
    driver.execute_script("document.getElementById('flash').textContent = ''")
    _css(driver, button).click()
    _wait(driver, lambda d: _flash(d), f"an answer to {button}")
    assert _flash(driver).startswith("done:"), _flash(driver)


def _log_in(driver: Any, base: str) -> None:
    driver.get(f"{base}/jobs")
    _wait(driver, _present("#password"), "the login form")
    _css(driver, "#user").send_keys(USER)
    _css(driver, "#password").send_keys(PASSWORD)
    _css(driver, "#login").click()
    _wait(driver, _present('#jobs tr[data-job="cm_data"]'), "the jobs table")


def _share(driver: Any) -> float:
    """What the job's bar shows (ids walked of ids planned)."""
    return float(_css(driver, "#summary .big").get_attribute("data-share") or 0)


def _shares(driver: Any, seen: int, timeout: float = 60) -> list[float]:
    """The job bar's values until it has shown `seen` different ones above 0."""
    values: list[float] = []

    def moved(d: Any) -> bool:
        share = _share(d)
        if share > 0 and share not in values:
            values.append(share)
        return len(values) >= seen

    _wait(driver, moved, "the job's bar to move", timeout)
    return values


def _screenshot(driver: Any, default: Path) -> Path:
    path = Path(os.environ.get("CONSOLE_SCREENSHOT") or default)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path)), path
    print(f"console screenshot: {path.resolve()}")
    return path


@pytest.mark.timeout(240)
def test_log_in_start_watch_the_bar_pause_and_resume(stack: Stack, browser: Any) -> None:
    _log_in(browser, stack.base)
    browser.get(f"{stack.base}/jobs/cm_data")
    _wait(browser, _present("#summary .big"), "the job's summary")
    _press(browser, "#btn-start")
    shares = _shares(browser, 2)
    assert shares == sorted(shares), shares
    _wait(browser, _present('#partitions tr[data-state="running"]'), "a running partition")
    shot = _screenshot(browser, stack.shots / "console.png")
    assert shot.stat().st_size > 10_000

    _press(browser, "#btn-pause")
    assert "job cm_data" in _flash(browser) and "state paused" in _flash(browser), _flash(browser)
    # Every partition not finished yet is paused: none runs or waits to run.
    wait_until(lambda: set(_statuses(stack.engine)) <= {"paused", "done"}, 60,
               f"every open partition paused in the database: {_statuses(stack.engine)}")
    assert "paused" in _statuses(stack.engine)
    assert _run_state(stack.engine) == "paused"
    _wait(browser, _present('#summary .state-paused'), "the page to show the pause")
    paused_at = _share(browser)
    assert paused_at < 1.0

    _press(browser, "#btn-resume")
    assert _run_state(stack.engine) == "running"
    wait_until(lambda: "running" in _statuses(stack.engine) or "done" in _statuses(stack.engine),
               60, "a partition working again after resume")
    _wait(browser, lambda d: _share(d) > paused_at, "the bar to move again", 90)
    runs = _css(browser, "#runs tbody").text
    for verb in ("start", "pause", "resume"):
        assert f"{verb} by console:{USER}@127.0.0.1" in runs, runs


@pytest.mark.timeout(180)
def test_replay_a_dead_letter(stack: Stack, browser: Any) -> None:
    from celery import Celery
    from sqlalchemy.orm import sessionmaker

    from tasks.deadletters.store import DeadLetters

    letters = DeadLetters(sessionmaker(stack.engine))
    letters.add("task", "nap-1", "redelivery cap reached", {
        "task": "devtools.samples.nap", "args": [0.05], "kwargs": {}})
    letter_id = letters.recent(1)[0].id
    browser.get(f"{stack.base}/deadletters")
    _wait(browser, _present(f'#letters tr[data-letter="{letter_id}"] a'), "the letter's row")
    _css(browser, f'#letters tr[data-letter="{letter_id}"] a').click()
    _wait(browser, _present("#fact-replayable"), "the letter's page")
    assert _css(browser, "#fact-replayable").text == "true"
    _press(browser, "#btn-replay")
    replayed = letters.get(letter_id)
    assert replayed.replayed_at is not None and replayed.replay_task_id
    _wait(browser, lambda d: _css(d, "#fact-replay_task_id").text == replayed.replay_task_id,
          "the page to show the replay's task id")
    assert not _css(browser, "#btn-replay").is_enabled()
    client = Celery(broker=WORKER_REDIS_URL, backend=WORKER_REDIS_URL, set_as_current=False)
    try:
        assert client.AsyncResult(replayed.replay_task_id).get(timeout=120) == 0.05
    finally:
        client.close()
    # A second replay is refused, and the page says why. The page re-renders as it polls and
    # may disable the button again between enabling and clicking it: press until refused.
    pressed = [0.0]

    def refused(driver: Any) -> bool:
        if _flash(driver).startswith("refused:"):
            return True
        if time.monotonic() - pressed[0] > 3:  # the last press was lost: press again
            driver.execute_script("document.getElementById('btn-replay').disabled = false")
            _css(driver, "#btn-replay").click()
            pressed[0] = time.monotonic()
        return False

    _wait(browser, refused, "the refusal")
    assert "already replayed" in _flash(browser)


@pytest.mark.timeout(120)
def test_every_page_fits_a_phone_width_screen(stack: Stack, browser: Any) -> None:
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 380, "height": 800, "deviceScaleFactor": 1, "mobile": True})
    try:
        for path, ready in (("/jobs", '#jobs tr[data-job="cm_data"]'),
                            ("/jobs/cm_data", "#partitions tr[data-part]"),
                            ("/restock", "#nodes tr[data-node]"),
                            ("/deadletters", "#letters tr[data-letter]")):
            browser.get(stack.base + path)
            _wait(browser, _present(ready), f"{path} filled in")
            wide = browser.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth]")
            assert wide[0] <= wide[1], (path, wide)
            assert _css(browser, "nav").is_displayed()
        phone = stack.shots / "console-phone.png"
        assert browser.save_screenshot(str(phone))
        print(f"console screenshot at phone width: {phone}")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
