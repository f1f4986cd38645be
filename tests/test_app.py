"""The Celery app: its configuration, its start-up checks, and a real worker answering a call."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import pytest
from celery import Celery

from tasks.celery import check_time_limits, configure
from tasks.config.settings import SettingsError
from tasks.wings import load_settings
from tests import SAMPLE_MODULES
from tests.support.workers import CELERY, ROOT, celery_call, platform_env, start_worker


def test_configuration_follows_the_design() -> None:
    conf = configure(load_settings({"VISIBILITY_TIMEOUT": "5000", "TIME_LIMIT": "4000",
                                    "SOFT_TIME_LIMIT": "3900"}))
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["broker_transport_options"]["visibility_timeout"] == 5000
    assert conf["result_backend_transport_options"]["visibility_timeout"] == 5000
    assert conf["visibility_timeout"] == 5000
    assert conf["task_soft_time_limit"] < conf["task_time_limit"] < 5000
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"]
    assert conf["worker_send_task_events"] and conf["task_send_sent_event"]


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"time_limit": 8000}, "below VISIBILITY_TIMEOUT"),
        ({"time_limit": 100, "soft_time_limit": 100}, "soft time limit"),
    ],
)
def test_a_task_whose_limits_outlive_the_visibility_timeout_is_refused(
    limits: dict[str, int], message: str
) -> None:
    probe = Celery("probe", set_as_current=False)
    probe.conf.update(configure(load_settings({"VISIBILITY_TIMEOUT": "7200"})))

    @probe.task(name=f"probe.slow.{uuid.uuid4().hex}", shared=False, **limits)
    def slow() -> None:  # pragma: no cover - never runs
        pass

    with pytest.raises(SettingsError, match=message):
        check_time_limits(probe)


def test_the_default_tasks_pass_the_start_up_check() -> None:
    from tasks.celery import app

    app.loader.import_default_modules()
    check_time_limits(app)
    assert "tasks.health.ping" in app.tasks


def test_a_real_worker_runs_the_health_task_sent_with_celery_call(
    worker_env: dict[str, str],
) -> None:
    worker = start_worker(worker_env, concurrency=1)
    try:
        sent = celery_call(worker_env, "tasks.health.ping")
        assert sent.returncode == 0, sent.stderr
        task_id = sent.stdout.strip().splitlines()[-1]
        got = subprocess.run(
            [*CELERY, "result", task_id], env=worker_env, cwd=ROOT,
            capture_output=True, text=True, timeout=60,
        )
        assert got.returncode == 0, got.stderr
        report = json.loads(got.stdout.strip().replace("'", '"'))
        assert report["status"] == "ok"
        assert report["redis"] == "ok" and report["database"] == "ok"
        assert report["pid"] != worker.pid  # ran in a prefork pool process
    finally:
        worker.stop()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
        ({"LEASE_TTL": "0"}, "LEASE_TTL"),
        ({"SOFT_TIME_LIMIT": "100", "TIME_LIMIT": "50"}, "SOFT_TIME_LIMIT"),
        ({"TIME_LIMIT": "100", "SOFT_TIME_LIMIT": "50", "VISIBILITY_TIMEOUT": "60"},
         "VISIBILITY_TIMEOUT"),
    ],
)
def test_a_worker_with_bad_settings_fails_at_start_up_with_a_clear_message(
    env: dict[str, str], message: str
) -> None:
    proc = subprocess.run(
        [*CELERY, "worker", "-P", "prefork", "-c", "1"], env=platform_env(**env), cwd=ROOT,
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout


@pytest.mark.parametrize(("modules", "expected"), [("", False), (SAMPLE_MODULES, True)])
def test_sample_tasks_are_registered_only_when_asked_for(modules: str, expected: bool) -> None:
    code = ("from tasks.celery import app; app.loader.import_default_modules(); "
            "import json; print(json.dumps(sorted(app.tasks)))")
    env = platform_env(EXTRA_TASK_MODULES=modules)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    names = json.loads(out.strip().splitlines()[-1])
    samples = [n for n in names if n.startswith(("devtools.samples.", "tests.support.sagas."))]
    assert ("devtools.samples.poison" in samples) is expected
    assert ("tests.support.sagas.sleepy_saga" in samples) is expected
    assert "tasks.examples.order_saga" in names and "tasks.ranges.start" in names


def test_every_task_the_readme_beat_and_compose_name_is_registered() -> None:
    """The README's `celery call` lines and beat's entries name tasks a default worker has
    (no EXTRA_TASK_MODULES): a moved module must keep its tasks' registered names."""
    code = ("from tasks.celery import app; app.loader.import_default_modules(); "
            "import json; print(json.dumps([sorted(app.tasks), "
            "sorted(e['task'] for e in app.conf.beat_schedule.values())]))")
    out = subprocess.run([sys.executable, "-c", code], env=platform_env(EXTRA_TASK_MODULES=""),
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    registered, scheduled = json.loads(out.strip().splitlines()[-1])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    called = set(re.findall(r"celery -A tasks call ([\w.]+)", readme))
    assert called and scheduled
    assert called - set(registered) == set()
    assert set(scheduled) - set(registered) == set()
    short = [name.rsplit(".", 1)[1] for name in registered if not name.startswith("celery.")]
    assert sorted({n for n in short if short.count(n) > 1}) == []


def test_the_image_holds_every_product_package_and_what_it_runs() -> None:
    """The image runs workers, beat, Flower and `python -m tasks`: the product packages and
    the flower extra, not the developer tools."""
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    for package in ("lease", "tasks", "beat"):
        assert f"COPY {package} {package}" in dockerfile
    for package in ("devtools", "bench", "tests"):
        assert f"COPY {package}" not in dockerfile
    assert "COPY pyproject.toml README.md flowerconfig.py" in dockerfile
    assert "pip install --no-cache-dir '.[postgres,flower]'" in dockerfile


def test_importing_a_pure_module_builds_no_app() -> None:
    """The package face does no work (Celery's `proj/celery.py` layout): importing a pure
    module reads no environment for the app, patches nothing and registers no app; `celery -A
    tasks` still finds the app in `tasks.celery`."""
    code = ("import sys, json, celery.app.task as t, tasks.ranges.planning, tasks.ranges.jobs; "
            "from kombu.transport import redis as k; "
            "print(json.dumps(['tasks.celery' in sys.modules, t.Task.Strategy, "
            "hasattr(k.Channel._connparams, '__wrapped__')]))")
    out = subprocess.run([sys.executable, "-c", code], env=platform_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    loaded, strategy, patched = json.loads(out.strip().splitlines()[-1])
    assert (loaded, strategy, patched) == (False, "celery.worker.strategy:default", False)
    found = subprocess.run([sys.executable, "-c", "from celery.app.utils import find_app; "
                            "print(find_app('tasks').main)"], env=platform_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert found.strip() == "tasks"
