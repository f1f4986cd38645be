"""One typed settings object, read from the environment in one function.

Every value has a default that runs on one machine (a local Redis, a SQLite file). A bad value
fails at start-up with a message that names the variable; a credential never appears in one.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tasks import redisconn

__all__ = ["Settings", "SettingsError", "load_settings", "redact"]

T = TypeVar("T")

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "sqlite:///rangekeeper.sqlite"

REDIS_SCHEMES = ("redis", "rediss", "unix")
BROKER_SCHEMES = (*REDIS_SCHEMES, "amqp", "amqps", "pyamqp")
# REDIS_URL, BROKER_URL and RESULT_BACKEND may also be a Sentinel URL list (SENTINEL_MASTER).
SENTINEL_SCHEMES = ("sentinel",)


class SettingsError(ValueError):
    """A setting has a value the platform cannot run with; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """Everything the platform reads from its environment. Times are in seconds."""

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_REDIS_URL
    result_backend: str = DEFAULT_REDIS_URL
    database_url: str = DEFAULT_DATABASE_URL
    lease_ttl: float = 10.0
    soft_time_limit: float = 3300.0
    time_limit: float = 3600.0
    visibility_timeout: int = 7200
    reconcile_interval: float = 5.0
    redelivery_cap: int = 5
    # A partition task hands its partition back after this long, to stay within time limits.
    range_slice: float = 300.0
    # A finished partition is checked once more for rows committed late (a transaction that
    # was open across its closing read) this long after it finished.
    range_settle: float = 60.0
    # Restock: the stock Redis masters (default: REDIS_URL alone); shard N lives on master
    # N % masters (one URL: every shard there; a cluster: wherever the shard's slot is).
    restock_redis_urls: tuple[str, ...] = ()
    # Logical stock shards (hash tag {stock:N}); a SKU's shard is crc32(SKU) % shards. Changing
    # it is a migration (docs/decisions.md, "Logical stock shards").
    restock_shards: int = 16
    restock_queues: int = 2  # delay queues per shard
    restock_delay: float = 600.0  # an unpaid item's stock comes back after this long
    restock_capacity: int = 100_000  # a delay queue holding this many stops syncing
    restock_batch: int = 100  # due entries per restock script call
    restock_interval: float = 5.0  # seconds between the sync/drain/rebuild jobs beat emits
    maintenance_every: float = 3 * 3600.0  # a node's next maintenance window after a rebuild
    # Compensated rollback journal rows (and the demo saga ledgers) are deleted this long after
    # their last change, by the sweeper.
    journal_retention: float = 7 * 86400.0
    # Modules every worker imports besides the platform's own (Celery's `include`): your range
    # jobs and tasks, or the samples and test-only tasks (`devtools.samples`).
    extra_task_modules: tuple[str, ...] = ()
    # A failed attempt that will be retried is rolled back before the retry (1), or hands its
    # journal over to the next attempt (0).
    rollback_on_retry: bool = True
    # The example job cm_data (tasks/examples/cm_data.py): ids per partition (partitions
    # planned later), rows per batch, threads per batch, `trivial` or `cpu` work per row, and a
    # sleep per batch so chaos tests can act mid-partition.
    cm_data_partition_size: int = 2_000_000
    cm_data_batch_size: int = 1000
    cm_data_parallelism: int = 2
    cm_data_work: str = "trivial"
    cm_data_batch_delay: float = 0.0
    # Adaptive batches for cm_data: seconds per batch to hold (0: fixed CM_DATA_BATCH_SIZE).
    cm_data_target_batch_s: float = 0.0
    # Dead letters older than this are deleted by the periodic prune (beat, hourly).
    dead_letter_retention: float = 30 * 86400.0
    # A task message whose body is larger is refused when sent and when received.
    max_message_bytes: int = 256 * 1024
    # Prometheus metrics of workers and beat (tasks/metrics.py): off when METRICS_PORT is unset.
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    # Worker and beat log lines: Celery's text format, or one JSON object per line.
    log_format: str = "text"
    # OpenTelemetry tracing (the `otel` extra, tasks/tracing.py) and where spans go.
    tracing: bool = False
    tracing_exporter: str = "otlp"
    # Liveness (tasks/heartbeat.py): a file the worker's main process touches every interval
    # (unset: none). Probes read its age, so they never queue behind work.
    worker_heartbeat_file: str | None = None
    worker_heartbeat_interval: float = 5.0
    # RabbitMQ quorum queues drop (or dead-letter) a message returned more often than this:
    # a backstop above REDELIVERY_CAP, which dead-letters into the database first.
    amqp_delivery_limit: int = 20
    # REDIS_URL on a Redis Cluster: its seed nodes (host:port,...); REDIS_URL then gives only
    # the password and must name db 0 (tasks/redisconn.py).
    redis_cluster_nodes: tuple[str, ...] = ()
    # The master every sentinel:// URL (REDIS_URL, BROKER_URL, RESULT_BACKEND) names.
    sentinel_master: str | None = None
    # Celery queues (tasks/routing.py): partitions, restock work, controls (reconcile, health,
    # rollback), and everything else.
    ranges_queue: str = "ranges"
    restock_queue: str = "restock"
    control_queue: str = "control"
    default_queue: str = "celery"
    # The operator console (`python -m tasks console`, tasks/console): it refuses to start
    # without a user and a password; it binds CONSOLE_ADDRESS. Its cookie-signing secret is
    # CONSOLE_SECRET, or a random one per start (sessions then end with the process).
    console_user: str | None = None
    console_password: str | None = dataclasses.field(default=None, repr=False)
    console_address: str = "127.0.0.1"
    console_port: int = 5566
    console_secret: str | None = dataclasses.field(default=None, repr=False)
    # Flower's address, linked from the console for task-level detail (optional).
    flower_url: str | None = None

    @property
    def restock_nodes(self) -> tuple[str, ...]:
        """The Redis URL of every stock master, master 0 first."""
        return self.restock_redis_urls or (self.redis_url,)

    @property
    def restock_queue_names(self) -> tuple[str, ...]:
        """The names of every node's delay queues: q0, q1, ..."""
        return tuple(f"q{i}" for i in range(self.restock_queues))

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
        if self.range_slice >= self.soft_time_limit:
            raise SettingsError(
                f"RANGE_SLICE ({self.range_slice:g}) must be below SOFT_TIME_LIMIT "
                f"({self.soft_time_limit:g})"
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


# Query parameters whose value is a credential (`?password=`, `sslpassword=`, `token=`...).
_SECRET_PARAM = re.compile(r"([?&;][^=&#;]*(?:pass|pwd|secret|token)[^=&#;]*=)[^&#;]*", re.I)


def redact(url: str) -> str:
    """Return `url` with any password replaced by `***`, for logs and error messages.

    Parsed by hand rather than with urlsplit: a password with an unencoded `#`, `/` or `?`
    would otherwise end the authority early and show its tail as the path or fragment. The
    authority ends at the last `@`, and everything after the first `:` before it is hidden
    (hiding too much is safe; showing a password is not). Credentials in the query string
    are hidden too.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _SECRET_PARAM.sub(r"\1***", url)
    userinfo, at, tail = rest.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        rest = f"{user}:***@{tail}"
    return _SECRET_PARAM.sub(r"\1***", f"{scheme}://{rest}")


def _url(schemes: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        try:
            scheme = urlsplit(raw).scheme
        except ValueError:
            scheme = ""
        if scheme not in schemes:
            raise SettingsError(
                f"{name}={redact(raw)!r} is not a valid URL: expected a scheme among "
                f"{', '.join(schemes)}"
            )
        if scheme == "rediss":
            _check_ssl_cert_reqs(name, raw)
        if scheme == "sentinel":
            _check(name, raw, redisconn.parse_sentinel_url)
        return raw

    return parse


def _check(name: str, raw: str, parse: Callable[[str], object]) -> None:
    try:
        parse(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={redact(raw)!r}: {exc}") from None


def _cluster_nodes(name: str, raw: str) -> tuple[str, ...]:
    _check(name, raw, redisconn.parse_cluster_nodes)
    return redisconn.parse_cluster_nodes(raw)


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
        _check("REDIS_URL", url, _db_zero)


def _db_zero(url: str) -> None:
    if redisconn.url_db(url) != 0:
        raise ValueError("names a database other than 0, and a Redis Cluster "
                         "(REDIS_CLUSTER_NODES) has only database 0")


SSL_CERT_REQS = ("required", "optional", "none", "cert_required", "cert_optional", "cert_none")


def _check_ssl_cert_reqs(name: str, raw: str) -> None:
    """Celery's broker and result backend refuse a rediss:// URL without ssl_cert_reqs on
    first use (after start-up looked fine): refuse it at start-up instead."""
    values = parse_qs(urlsplit(raw).query).get("ssl_cert_reqs", [])
    if not values or values[-1].lower() not in SSL_CERT_REQS:
        raise SettingsError(
            f"{name}={redact(raw)!r}: a rediss:// URL must say how to check the server's "
            "certificate, e.g. ?ssl_cert_reqs=required (or optional, none)")


def _url_list(schemes: tuple[str, ...]) -> Callable[[str, str], tuple[str, ...]]:
    one = _url(schemes)

    def parse(name: str, raw: str) -> tuple[str, ...]:
        urls = tuple(part.strip() for part in raw.split(","))
        if any(not url for url in urls):
            raise SettingsError(f"{name} must be a comma-separated list of URLs, "
                                "with no empty entry")
        return tuple(one(name, url) for url in urls)

    return parse


def _flag(name: str, raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} must be 1 or 0 (true/false, yes/no, on/off)")


def _database_url(name: str, raw: str) -> str:
    try:
        make_url(raw)
    except ArgumentError as exc:
        raise SettingsError(f"{name}={redact(raw)!r} is not a SQLAlchemy URL: {exc}") from None
    return raw


def _modules(name: str, raw: str) -> tuple[str, ...]:
    modules = tuple(part.strip() for part in raw.split(","))
    for module in modules:
        if not _MODULE.fullmatch(module):
            raise SettingsError(f"{name}: {module[:64]!r} is not a dotted module name")
    return modules


_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _one_of(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw not in choices:
            raise SettingsError(f"{name}={raw[:32]!r} must be one of {', '.join(choices)}")
        return raw

    return parse


def _at_least(cast: Callable[[str], T], minimum: float) -> Callable[[str, str], T]:
    def parse(name: str, raw: str) -> T:
        try:
            value = cast(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw[:32]!r} is not a number") from None
        if not value >= minimum:  # type: ignore[operator]
            raise SettingsError(f"{name}={raw[:32]!r} must be at least {minimum:g}")
        return value

    return parse


def _positive(cast: Callable[[str], T]) -> Callable[[str, str], T]:
    def parse(name: str, raw: str) -> T:
        try:
            value = cast(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not a number") from None
        if not value > 0:  # type: ignore[operator]
            raise SettingsError(f"{name}={raw!r} must be greater than 0")
        return value

    return parse


def _port(name: str, raw: str) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SettingsError(f"{name}={raw!r} must be a TCP port (1-65535)")
    return int(raw)


def _address(name: str, raw: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise SettingsError(f"{name}={raw!r} must be an IP address (e.g. 127.0.0.1)") from None


def _sentinel_master(name: str, raw: str) -> str:
    if not _MASTER_NAME.fullmatch(raw):
        raise SettingsError(f"{name}={raw[:64]!r} must be a master name (letters, digits, "
                            "'.', '-', '_')")
    return raw


_MASTER_NAME = re.compile(r"[\w.-]{1,128}")


def _queue(name: str, raw: str) -> str:
    if not _MASTER_NAME.fullmatch(raw):
        raise SettingsError(f"{name}={raw[:64]!r} must be a queue name (letters, digits, "
                            "'.', '-', '_')")
    return raw


def _secret(name: str, raw: str) -> str:
    if len(raw) < 32:
        raise SettingsError(f"{name} must be at least 32 characters (it signs session cookies)")
    return raw


_FIELDS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "redis_url": ("REDIS_URL", _url((*REDIS_SCHEMES, *SENTINEL_SCHEMES))),
    "broker_url": ("BROKER_URL", _url((*BROKER_SCHEMES, *SENTINEL_SCHEMES))),
    "result_backend": ("RESULT_BACKEND", _url((*REDIS_SCHEMES, *SENTINEL_SCHEMES))),
    "database_url": ("DATABASE_URL", _database_url),
    "lease_ttl": ("LEASE_TTL", _positive(float)),
    "soft_time_limit": ("SOFT_TIME_LIMIT", _positive(float)),
    "time_limit": ("TIME_LIMIT", _positive(float)),
    "visibility_timeout": ("VISIBILITY_TIMEOUT", _positive(int)),
    "reconcile_interval": ("RECONCILE_INTERVAL", _positive(float)),
    "redelivery_cap": ("REDELIVERY_CAP", _positive(int)),
    "range_slice": ("RANGE_SLICE", _positive(float)),
    "range_settle": ("RANGE_SETTLE", _positive(float)),
    "restock_redis_urls": ("RESTOCK_REDIS_URLS", _url_list(REDIS_SCHEMES)),
    "restock_shards": ("RESTOCK_SHARDS", _positive(int)),
    "restock_queues": ("RESTOCK_QUEUES", _positive(int)),
    "restock_delay": ("RESTOCK_DELAY", _positive(float)),
    "restock_capacity": ("RESTOCK_CAPACITY", _positive(int)),
    "restock_batch": ("RESTOCK_BATCH", _positive(int)),
    "restock_interval": ("RESTOCK_INTERVAL", _positive(float)),
    "maintenance_every": ("MAINTENANCE_EVERY", _positive(float)),
    "journal_retention": ("JOURNAL_RETENTION", _positive(float)),
    "extra_task_modules": ("EXTRA_TASK_MODULES", _modules),
    "rollback_on_retry": ("ROLLBACK_ON_RETRY", _flag),
    "cm_data_partition_size": ("CM_DATA_PARTITION_SIZE", _at_least(int, 1)),
    "cm_data_batch_size": ("CM_DATA_BATCH_SIZE", _at_least(int, 1)),
    "cm_data_parallelism": ("CM_DATA_PARALLELISM", _at_least(int, 1)),
    "cm_data_work": ("CM_DATA_WORK", _one_of("trivial", "cpu")),
    "cm_data_batch_delay": ("CM_DATA_BATCH_DELAY", _at_least(float, 0)),
    "cm_data_target_batch_s": ("CM_DATA_TARGET_BATCH_S", _at_least(float, 0)),
    "dead_letter_retention": ("DEAD_LETTER_RETENTION", _positive(float)),
    "max_message_bytes": ("MAX_MESSAGE_BYTES", _positive(int)),
    "metrics_port": ("METRICS_PORT", _port),
    "metrics_address": ("METRICS_ADDRESS", _address),
    "log_format": ("LOG_FORMAT", _one_of("text", "json")),
    "tracing": ("TRACING", _flag),
    "tracing_exporter": ("TRACING_EXPORTER", _one_of("otlp", "console")),
    "worker_heartbeat_file": ("WORKER_HEARTBEAT_FILE", lambda _name, raw: raw),
    "worker_heartbeat_interval": ("WORKER_HEARTBEAT_INTERVAL", _positive(float)),
    "amqp_delivery_limit": ("AMQP_DELIVERY_LIMIT", _positive(int)),
    "redis_cluster_nodes": ("REDIS_CLUSTER_NODES", _cluster_nodes),
    "sentinel_master": ("SENTINEL_MASTER", _sentinel_master),
    "ranges_queue": ("RANGES_QUEUE", _queue),
    "restock_queue": ("RESTOCK_QUEUE", _queue),
    "control_queue": ("CONTROL_QUEUE", _queue),
    "default_queue": ("DEFAULT_QUEUE", _queue),
    "console_user": ("CONSOLE_USER", lambda _name, raw: raw),
    "console_password": ("CONSOLE_PASSWORD", lambda _name, raw: raw),
    "console_address": ("CONSOLE_ADDRESS", _address),
    "console_port": ("CONSOLE_PORT", _port),
    "console_secret": ("CONSOLE_SECRET", _secret),
    "flower_url": ("FLOWER_URL", _url(("http", "https"))),
}


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read `Settings` from `env` (default `os.environ`); raise `SettingsError` on a bad value.

    BROKER_URL and RESULT_BACKEND default to REDIS_URL, so one variable points the whole
    platform at one Redis.
    """
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for field, (name, parse) in _FIELDS.items():
        raw = env.get(name, "").strip()
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
    return Settings(**values)  # type: ignore[arg-type]
