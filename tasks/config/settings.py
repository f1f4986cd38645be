"""One typed settings object, read from the environment in one function.

Every value has a default that runs on one machine (a local Redis, a SQLite file). A bad value
fails at start-up with a message that names the variable; a credential never appears in one.

The core's settings are fields of `Settings`; each wing brings its own section (a frozen
dataclass deriving from `Section`, declared in the wing and listed by `tasks.wings`), read by
the same function and reached with `settings.section(TheSection)`. A section's variable names
come from its field names: ENV_PREFIX + the field's name in capitals (`RESTOCK_` + `shards`:
RESTOCK_SHARDS), unless the field names its variable (`setting(..., env="MAINTENANCE_EVERY")`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from tasks.config import envparse, redisconn
from tasks.config.envparse import SettingsError, redact

__all__ = ["Settings", "SettingsError", "load_settings", "redact", "Section", "setting",
           "load_section", "env_name", "settings_of", "variables"]

S = TypeVar("S")

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "sqlite:///rangekeeper.sqlite"

REDIS_SCHEMES = ("redis", "rediss", "unix")
BROKER_SCHEMES = (*REDIS_SCHEMES, "amqp", "amqps", "pyamqp")
# REDIS_URL, BROKER_URL and RESULT_BACKEND may also be a Sentinel URL list (SENTINEL_MASTER).
SENTINEL_SCHEMES = ("sentinel",)


@dataclass(frozen=True)
class Settings:
    """Everything the platform reads from its environment. Times are in seconds."""

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_REDIS_URL
    result_backend: str = DEFAULT_REDIS_URL
    database_url: str = DEFAULT_DATABASE_URL
    # PostgreSQL: the schema every table of the platform (and of its wings) lives in, made by
    # `migrate` and put first on each connection's search_path (None: the server's default).
    database_schema: str | None = None
    lease_ttl: float = 10.0
    soft_time_limit: float = 3300.0
    time_limit: float = 3600.0
    visibility_timeout: int = 7200
    reconcile_interval: float = 5.0
    redelivery_cap: int = 5
    # Modules every worker imports besides the platform's own (Celery's `include`): your range
    # jobs and tasks, or the samples and test-only tasks (`devtools.samples`).
    extra_task_modules: tuple[str, ...] = ()
    # Dead letters older than this are deleted by the periodic prune (beat, hourly).
    dead_letter_retention: float = 30 * 86400.0
    # A task message whose body is larger is refused when sent and when received.
    max_message_bytes: int = 256 * 1024
    # Prometheus metrics of workers and beat (tasks/observe/metrics.py): off when METRICS_PORT
    # is unset.
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    # Worker and beat log lines: Celery's text format, or one JSON object per line.
    log_format: str = "text"
    # OpenTelemetry tracing (the `otel` extra, tasks/observe/tracing.py) and where spans go.
    tracing: bool = False
    tracing_exporter: str = "otlp"
    # Statement spans (`sql`, `redis`): off, a partition runs thousands of statements a second.
    tracing_statements: tuple[str, ...] = ()
    # Spans kept per task in one process, its own included (the rest are dropped and counted
    # on the task's span): about as many batches, or a few hundred with statement spans.
    tracing_max_spans: int = 2000
    # Which traces are kept: the standard OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (the
    # ratio of the *traceidratio samplers), checked here since the SDK ignores a bad one.
    tracing_sampler: str = "parentbased_always_on"
    tracing_sampler_arg: float = 1.0
    # Liveness (tasks/worker/heartbeat.py): a file the worker's main process touches every interval
    # and beat's loop every tick (beat/scheduler.py); unset: none. Probes read its age, so they
    # never queue behind work.
    worker_heartbeat_file: str | None = None
    worker_heartbeat_interval: float = 5.0
    # RabbitMQ quorum queues drop (or dead-letter) a message returned more often than this:
    # a backstop above REDELIVERY_CAP, which dead-letters into the database first.
    amqp_delivery_limit: int = 20
    # REDIS_URL on a Redis Cluster: its seed nodes (host:port,...); REDIS_URL then gives only
    # the password and must name db 0 (tasks/config/redisconn.py).
    redis_cluster_nodes: tuple[str, ...] = ()
    # The master every sentinel:// URL (REDIS_URL, BROKER_URL, RESULT_BACKEND) names.
    sentinel_master: str | None = None
    # Celery queues (tasks/worker/queues.py): controls (reconcile rounds, health, rollback)
    # and everything else; each wing's own queues are in its section.
    control_queue: str = "control"
    default_queue: str = "celery"
    # The operator console (`python -m tasks console`, tasks/console): it refuses to start
    # without a user and a password, or with a password or secret shipped in this repository;
    # it binds CONSOLE_ADDRESS. Its cookie-signing secret is CONSOLE_SECRET, or a random one
    # per start (sessions then end with the process).
    console_user: str | None = None
    console_password: str | None = dataclasses.field(default=None, repr=False)
    console_address: str = "127.0.0.1"
    console_port: int = 5566
    console_secret: str | None = dataclasses.field(default=None, repr=False)
    # Cookies are Secure on every answer (the console is reached over HTTPS only, e.g. through
    # a TLS-terminating proxy), not only on HTTPS requests.
    console_secure_cookies: bool = False
    # Proxies (addresses or networks) whose X-Forwarded-Proto and X-Forwarded-For the console
    # believes: the client's address (login limits, logs) and whether it came over HTTPS.
    console_trusted_proxies: tuple[str, ...] = ()
    # A second local account that may read everything and change nothing (the role viewer;
    # CONSOLE_USER is the operator). Both or neither; the password follows CONSOLE_PASSWORD's
    # rules.
    console_viewer_user: str | None = None
    console_viewer_password: str | None = dataclasses.field(default=None, repr=False)
    # Single sign-on through a trusted proxy (oauth2-proxy): `proxy` logs in the user named by
    # X-Forwarded-User on a request from CONSOLE_TRUSTED_PROXIES, with the role its
    # X-Forwarded-Groups map to (operator groups first); `off`: the local login only.
    console_sso: str = "off"
    console_operator_groups: tuple[str, ...] = ()
    console_viewer_groups: tuple[str, ...] = ()
    # Flower's address, linked from the console for task-level detail (optional).
    flower_url: str | None = None
    # The wings' sections (`Section` instances, one per class), read by `load_settings`.
    sections: tuple[Any, ...] = ()

    def section(self, cls: type[S]) -> S:
        """This object's section of class `cls` (a wing's settings)."""
        for found in self.sections:
            if type(found) is cls:
                return found  # type: ignore[no-any-return]
        raise SettingsError(f"these settings were loaded without the {cls.__name__} section "
                            "(tasks.wings.load_settings reads every wing's)")

    def __post_init__(self) -> None:
        _check_redis_topology(self)
        if self.soft_time_limit >= self.time_limit:
            raise SettingsError(
                f"SOFT_TIME_LIMIT ({self.soft_time_limit:g}) must be below "
                f"TIME_LIMIT ({self.time_limit:g})"
            )
        if self.visibility_timeout <= self.time_limit:
            raise SettingsError(
                f"VISIBILITY_TIMEOUT ({self.visibility_timeout}) must exceed TIME_LIMIT "
                f"({self.time_limit:g}), or a running task is redelivered while it still runs"
            )
        if self.amqp_delivery_limit <= self.redelivery_cap:
            raise SettingsError(
                f"AMQP_DELIVERY_LIMIT ({self.amqp_delivery_limit}) must exceed REDELIVERY_CAP "
                f"({self.redelivery_cap}), or RabbitMQ drops a poison message before the cap "
                "dead-letters it"
            )
        if self.lease_ttl >= self.visibility_timeout:
            raise SettingsError(
                f"LEASE_TTL ({self.lease_ttl:g}) must be below VISIBILITY_TIMEOUT "
                f"({self.visibility_timeout})"
            )


def _check_redis_topology(settings: Settings) -> None:
    """Sentinel URLs need SENTINEL_MASTER; REDIS_CLUSTER_NODES needs a redis:// REDIS_URL
    on db 0 (it gives only the cluster's password)."""
    urls = {"REDIS_URL": settings.redis_url, "BROKER_URL": settings.broker_url,
            "RESULT_BACKEND": settings.result_backend}
    for name, url in urls.items():
        if redisconn.is_sentinel(url) and not settings.sentinel_master:
            raise SettingsError(f"{name} is a sentinel:// URL: set SENTINEL_MASTER to the "
                                "name the sentinels monitor the master under")
    if settings.redis_cluster_nodes:
        url = settings.redis_url
        if urlsplit(url).scheme not in ("redis", "rediss"):
            raise SettingsError(f"REDIS_URL={redact(url)!r}: with REDIS_CLUSTER_NODES it must "
                                "be redis:// or rediss:// (it gives the cluster's password)")
        envparse.check("REDIS_URL", url, envparse.db_zero)


_FIELDS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "redis_url": ("REDIS_URL", envparse.url((*REDIS_SCHEMES, *SENTINEL_SCHEMES))),
    "broker_url": ("BROKER_URL", envparse.url((*BROKER_SCHEMES, *SENTINEL_SCHEMES))),
    "result_backend": ("RESULT_BACKEND", envparse.url((*REDIS_SCHEMES, *SENTINEL_SCHEMES))),
    "database_url": ("DATABASE_URL", envparse.database_url),
    "database_schema": ("DATABASE_SCHEMA", envparse.identifier),
    "lease_ttl": ("LEASE_TTL", envparse.positive(float)),
    "soft_time_limit": ("SOFT_TIME_LIMIT", envparse.positive(float)),
    "time_limit": ("TIME_LIMIT", envparse.positive(float)),
    "visibility_timeout": ("VISIBILITY_TIMEOUT", envparse.positive(int)),
    "reconcile_interval": ("RECONCILE_INTERVAL", envparse.positive(float)),
    "redelivery_cap": ("REDELIVERY_CAP", envparse.positive(int)),
    "extra_task_modules": ("EXTRA_TASK_MODULES", envparse.modules),
    "dead_letter_retention": ("DEAD_LETTER_RETENTION", envparse.positive(float)),
    "max_message_bytes": ("MAX_MESSAGE_BYTES", envparse.positive(int)),
    "metrics_port": ("METRICS_PORT", envparse.port),
    "metrics_address": ("METRICS_ADDRESS", envparse.address),
    "log_format": ("LOG_FORMAT", envparse.one_of("text", "json")),
    "tracing": ("TRACING", envparse.flag),
    "tracing_exporter": ("TRACING_EXPORTER", envparse.one_of("otlp", "console")),
    "tracing_statements": ("TRACING_STATEMENTS", envparse.some_of("sql", "redis")),
    "tracing_max_spans": ("TRACING_MAX_SPANS", envparse.positive(int)),
    "tracing_sampler": ("OTEL_TRACES_SAMPLER", envparse.one_of(
        "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio",
        "always_on", "always_off", "traceidratio")),
    "tracing_sampler_arg": ("OTEL_TRACES_SAMPLER_ARG", envparse.fraction),
    "worker_heartbeat_file": ("WORKER_HEARTBEAT_FILE", lambda _name, raw: raw),
    "worker_heartbeat_interval": ("WORKER_HEARTBEAT_INTERVAL", envparse.positive(float)),
    "amqp_delivery_limit": ("AMQP_DELIVERY_LIMIT", envparse.positive(int)),
    "redis_cluster_nodes": ("REDIS_CLUSTER_NODES", envparse.cluster_nodes),
    "sentinel_master": ("SENTINEL_MASTER", envparse.sentinel_master),
    "control_queue": ("CONTROL_QUEUE", envparse.queue),
    "default_queue": ("DEFAULT_QUEUE", envparse.queue),
    "console_user": ("CONSOLE_USER", lambda _name, raw: raw),
    "console_password": ("CONSOLE_PASSWORD", lambda _name, raw: raw),
    "console_address": ("CONSOLE_ADDRESS", envparse.address),
    "console_port": ("CONSOLE_PORT", envparse.port),
    "console_secret": ("CONSOLE_SECRET", envparse.secret),
    "console_secure_cookies": ("CONSOLE_SECURE_COOKIES", envparse.flag),
    "console_trusted_proxies": ("CONSOLE_TRUSTED_PROXIES", envparse.networks),
    "console_viewer_user": ("CONSOLE_VIEWER_USER", lambda _name, raw: raw),
    "console_viewer_password": ("CONSOLE_VIEWER_PASSWORD", lambda _name, raw: raw),
    "console_sso": ("CONSOLE_SSO", envparse.one_of("off", "proxy")),
    "console_operator_groups": ("CONSOLE_OPERATOR_GROUPS", lambda _n, raw: _names(raw)),
    "console_viewer_groups": ("CONSOLE_VIEWER_GROUPS", lambda _n, raw: _names(raw)),
    "flower_url": ("FLOWER_URL", envparse.url(("http", "https"))),
}


def _names(raw: str) -> tuple[str, ...]:
    """A comma-separated list of names (groups), blanks dropped."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def load_settings(env: Mapping[str, str] | None = None,
                  sections: Iterable[type[Section]] = ()) -> Settings:
    """Read `Settings` and the `sections` (the wings' section classes) from `env` (default
    `os.environ`); raise `SettingsError` on a bad value.

    BROKER_URL and RESULT_BACKEND default to REDIS_URL, so one variable points the whole
    platform at one Redis.
    """
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for field, (name, parse) in _FIELDS.items():
        raw = envparse.value(env, name)
        if raw:
            values[field] = parse(name, raw)
    redis_url = str(values.get("redis_url", DEFAULT_REDIS_URL))
    if values.get("redis_cluster_nodes"):
        for field, name in (("broker_url", "BROKER_URL"), ("result_backend", "RESULT_BACKEND")):
            if field not in values:
                raise SettingsError(
                    f"REDIS_CLUSTER_NODES is set: set {name} too (Celery's Redis broker and "
                    "result backend cannot use a Redis Cluster; a Redis, Sentinel or RabbitMQ)")
    values.setdefault("broker_url", redis_url)
    values.setdefault("result_backend", redis_url)
    core = Settings(**values)  # type: ignore[arg-type]
    if core.database_schema and not core.database_url.startswith("postgresql"):
        raise SettingsError("DATABASE_SCHEMA applies to PostgreSQL only (on MariaDB the "
                            "database in DATABASE_URL is the schema; SQLite has none)")
    found = tuple(load_section(cls, env) for cls in sections)
    for section in found:
        section.check(core)
    return dataclasses.replace(core, sections=found)


class Section:
    """A wing's settings section: a frozen dataclass deriving from this class, whose fields
    are made with `setting` (the parser of each); its variables are named ENV_PREFIX + the
    field's name in capitals unless a field names its own."""

    ENV_PREFIX: ClassVar[str] = ""

    def check(self, settings: Settings) -> None:
        """Refuse values that do not fit the core's (`SettingsError`); nothing by default."""


def setting(default: Any, parse: Callable[[str, str], object], env: str | None = None) -> Any:
    """A section field: its default, its parser (`tasks.config.envparse`) and, when its name
    does not follow from the field's, its variable."""
    return dataclasses.field(default=default, metadata={"parse": parse, "env": env})


def env_name(cls: type[Section], field: dataclasses.Field[Any]) -> str:
    """The variable a section's field is read from."""
    return field.metadata.get("env") or cls.ENV_PREFIX + field.name.upper()


def variables(sections: Iterable[type[Section]] = ()) -> set[str]:
    """Every variable the core and `sections` read."""
    names = {name for name, _ in _FIELDS.values()}
    for cls in sections:
        names.update(env_name(cls, f) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                     if "parse" in f.metadata)
    return names


def load_section(cls: type[S], env: Mapping[str, str]) -> S:
    """Read the section `cls` from `env`; `SettingsError` names a bad variable."""
    values: dict[str, object] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        parse = field.metadata.get("parse")
        if parse is None:
            continue
        name = env_name(cls, field)  # type: ignore[arg-type]
        raw = envparse.value(env, name)
        if raw:
            values[field.name] = parse(name, raw)
    return cls(**values)


def settings_of(app: Any) -> Settings:
    """The settings of the Celery app `app` (`tasks.celery` hands its app the settings it
    read, `platform_settings`), or the core's read from the environment for an app that
    carries none (a bare client)."""
    found = getattr(app, "platform_settings", None)
    return found if isinstance(found, Settings) else load_settings()
