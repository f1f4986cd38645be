"""Settings: defaults, parsing, and a clear start-up error for every bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.config.settings import DEFAULT_DATABASE_URL, SettingsError, redact
from tasks.restock.settings import restock_settings
from tasks.rollback.settings import rollback_settings
from tasks.wings import load_settings


def test_defaults_are_a_local_redis_and_a_sqlite_file() -> None:
    settings = load_settings({})
    assert settings.redis_url == settings.broker_url == settings.result_backend
    assert settings.redis_url.startswith("redis://127.0.0.1:6379")
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.soft_time_limit < settings.time_limit < settings.visibility_timeout


def test_one_redis_url_points_broker_and_backend_there_unless_overridden() -> None:
    settings = load_settings({"REDIS_URL": "redis://127.0.0.1:6390/2",
                              "BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"})
    assert settings.result_backend == "redis://127.0.0.1:6390/2"
    assert settings.broker_url.startswith("amqp://")


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"REDIS_URL": "127.0.0.1:6379"}, "REDIS_URL"),
        ({"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL"),
        ({"BROKER_URL": "kafka://x"}, "BROKER_URL"),
        ({"DATABASE_URL": "not a url"}, "DATABASE_URL"),
        ({"LEASE_TTL": "0"}, "LEASE_TTL"),
        ({"LEASE_TTL": "-3"}, "LEASE_TTL"),
        ({"LEASE_TTL": "ten"}, "LEASE_TTL"),
        ({"SOFT_TIME_LIMIT": "60", "TIME_LIMIT": "60"}, "SOFT_TIME_LIMIT"),
        ({"SOFT_TIME_LIMIT": "90", "TIME_LIMIT": "60"}, "SOFT_TIME_LIMIT"),
        ({"TIME_LIMIT": "600", "SOFT_TIME_LIMIT": "500", "VISIBILITY_TIMEOUT": "600"},
         "VISIBILITY_TIMEOUT"),
        ({"VISIBILITY_TIMEOUT": "1.5"}, "VISIBILITY_TIMEOUT"),
        ({"REDELIVERY_CAP": "0"}, "REDELIVERY_CAP"),
        ({"RESTOCK_REDIS_URLS": "redis://127.0.0.1:6379/0,"}, "RESTOCK_REDIS_URLS"),
        ({"RESTOCK_REDIS_URLS": "redis://127.0.0.1:6379/0,http://x"}, "RESTOCK_REDIS_URLS"),
        ({"RESTOCK_QUEUES": "0"}, "RESTOCK_QUEUES"),
        ({"RESTOCK_DELAY": "-1"}, "RESTOCK_DELAY"),
        ({"RESTOCK_CAPACITY": "many"}, "RESTOCK_CAPACITY"),
        ({"RESTOCK_BATCH": "0"}, "RESTOCK_BATCH"),
        ({"MAINTENANCE_EVERY": "0"}, "MAINTENANCE_EVERY"),
        # Issue 10: every setting is read by the one settings object.
        ({"ROLLBACK_ON_RETRY": "maybe"}, "ROLLBACK_ON_RETRY"),
        ({"EXTRA_TASK_MODULES": "myjobs,../evil"}, "EXTRA_TASK_MODULES"),
        ({"EXTRA_TASK_MODULES": "myjobs,"}, "EXTRA_TASK_MODULES"),
    ],
)
def test_bad_values_are_rejected_naming_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError, match=names):
        load_settings(env)


@pytest.mark.parametrize("name", ["REDIS_URL", "BROKER_URL", "RESULT_BACKEND"])
@pytest.mark.parametrize("query", ["", "?ssl_cert_reqs=", "?ssl_cert_reqs=maybe"])
def test_a_rediss_url_without_ssl_cert_reqs_is_refused_at_start_up(name: str, query: str) -> None:
    with pytest.raises(SettingsError, match=f"{name}=.*ssl_cert_reqs") as info:
        load_settings({name: f"rediss://:s3#cret@127.0.0.1:6380/0{query}"})
    assert "s3" not in str(info.value) and "cret" not in str(info.value)


def test_a_rediss_url_with_ssl_cert_reqs_is_accepted() -> None:
    url = "rediss://127.0.0.1:6380/0?ssl_cert_reqs=required"
    assert load_settings({"REDIS_URL": url}).broker_url == url


def test_errors_never_show_a_password() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({"REDIS_URL": "http://user:s3cret@127.0.0.1:6379/0"})
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("postgresql://bob:pw@127.0.0.1/test", "postgresql://bob:***@127.0.0.1/test"),
        ("sqlite:///x.sqlite", "sqlite:///x.sqlite"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        # Issue 9 item 16: credentials in the query string, unencoded # / ? @ in passwords.
        ("redis://127.0.0.1:6379/0?password=s3cret", "redis://127.0.0.1:6379/0?password=***"),
        ("postgresql://bob@h/db?sslmode=require&password=s3cret&x=1",
         "postgresql://bob@h/db?sslmode=require&password=***&x=1"),
        ("redis://:pa#ss@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("redis://user:pa/ss@127.0.0.1:6379/0", "redis://user:***@127.0.0.1:6379/0"),
        ("redis://:p?w@d@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:***@127.0.0.1:5672//"),
        ("postgresql://bob@h/db?application_name=a@b", "postgresql://bob@h/db?application_name=a@b"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_restock_nodes_default_to_redis_url_and_parse_a_list() -> None:
    one = load_settings({"REDIS_URL": "redis://127.0.0.1:6390/1"})
    assert restock_settings(one).nodes(one) == ("redis://127.0.0.1:6390/1",)
    two = load_settings({"RESTOCK_REDIS_URLS": "redis://127.0.0.1:7001/0, redis://127.0.0.1:7002/0"})
    restock = restock_settings(two)
    assert restock.nodes(two) == ("redis://127.0.0.1:7001/0", "redis://127.0.0.1:7002/0")
    assert (restock.delay, restock.capacity, restock.batch) == (600.0, 100_000, 100)


def test_the_one_settings_object_reads_the_rollback_flag_and_task_modules() -> None:
    found = load_settings({"ROLLBACK_ON_RETRY": "off", "EXTRA_TASK_MODULES": "a.b, c",
                           "CM_DATA_BATCH_DELAY": "0.5", "RESTOCK_QUEUES": "3"})
    assert rollback_settings(found).on_retry is False
    assert found.extra_task_modules == ("a.b", "c")
    assert restock_settings(found).queue_names == ("q0", "q1", "q2")
    defaults = load_settings({})
    assert rollback_settings(defaults).on_retry is True and defaults.extra_task_modules == ()


@pytest.mark.parametrize(("name", "url"), [
    ("DATABASE_URL", "postgresql+psycopg://rangekeeper:change-me@postgres:5432/rangekeeper"),
    ("BROKER_URL", "amqp://rangekeeper:change-me@rabbitmq:5672/rangekeeper"),
    ("BROKER_URL", "amqp://rangekeeper:PASSWORD@rabbitmq:5672//"),
    ("REDIS_URL", "redis://:Change%2DMe@127.0.0.1:6379/0"),
    ("RESULT_BACKEND", "redis://:rangekeeper@127.0.0.1:6379/0"),
    ("RESTOCK_REDIS_URLS", "redis://127.0.0.1:7001/0,redis://:changeme@127.0.0.1:7002/0"),
])
def test_a_url_with_a_shipped_password_is_refused_at_start(name: str, url: str) -> None:
    """Issue 18 item 9: deploy/k8s shipped these URLs with `change-me`; a password anyone can
    read in the repository is no password."""
    with pytest.raises(SettingsError, match=f"{name}=.*shipped") as info:
        load_settings({name: url})
    assert "change" not in str(info.value).lower() and ":***@" in str(info.value)


def test_a_url_with_a_password_of_its_own_is_accepted() -> None:
    found = load_settings({"DATABASE_URL": "postgresql+psycopg://rk:x7-Qv2p@db:5432/rk",
                           "BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"})
    assert found.database_url.endswith("@db:5432/rk")


def test_the_console_cookie_settings() -> None:
    found = load_settings({"CONSOLE_SECURE_COOKIES": "yes",
                           "CONSOLE_TRUSTED_PROXIES": "10.0.0.7, 10.1.0.0/16,::1"})
    assert found.console_secure_cookies is True
    assert found.console_trusted_proxies == ("10.0.0.7/32", "10.1.0.0/16", "::1/128")
    defaults = load_settings({})
    assert defaults.console_secure_cookies is False and defaults.console_trusted_proxies == ()
    with pytest.raises(SettingsError, match="CONSOLE_TRUSTED_PROXIES: 'proxy.local'"):
        load_settings({"CONSOLE_TRUSTED_PROXIES": "10.0.0.7,proxy.local"})


def test_a_variable_may_come_from_a_file_named_by_its_file_variable(tmp_path: Path) -> None:
    secret = tmp_path / "redis_url"
    secret.write_text("redis://:from-a-file@127.0.0.1:6379/4\n")  # a mounted secret's newline
    (tmp_path / "ttl").write_text("7.5")
    settings = load_settings({"REDIS_URL_FILE": str(secret),
                              "LEASE_TTL_FILE": str(tmp_path / "ttl"), "LEASE_TTL": ""})
    assert settings.lease_ttl == 7.5
    assert settings.redis_url == "redis://:from-a-file@127.0.0.1:6379/4"
    assert settings.broker_url == settings.redis_url  # the default follows it as before


def test_a_file_variable_that_cannot_be_read_or_doubles_its_variable_is_refused(
    tmp_path: Path
) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(SettingsError, match=r"^REDIS_URL_FILE=.*nope'?: cannot read it"):
        load_settings({"REDIS_URL_FILE": str(missing)})
    present = tmp_path / "url"
    present.write_text("redis://127.0.0.1:6379/4")
    with pytest.raises(SettingsError, match="REDIS_URL and REDIS_URL_FILE are both set"):
        load_settings({"REDIS_URL_FILE": str(present), "REDIS_URL": "redis://127.0.0.1/1"})
    (tmp_path / "ttl").write_text("abc")
    with pytest.raises(SettingsError, match="LEASE_TTL='abc' is not a number"):
        load_settings({"LEASE_TTL_FILE": str(tmp_path / "ttl")})
