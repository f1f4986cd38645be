"""Parsers of environment values for `tasks.config.settings`: each takes the variable's name and its
raw value and returns the parsed value, or raises `SettingsError` naming the variable (with any
credential in the value redacted).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tasks.config import redisconn

__all__ = [
    "SettingsError", "redact", "url", "url_list", "check", "cluster_nodes", "db_zero", "flag",
    "database_url", "modules", "one_of", "some_of", "fraction", "at_least", "positive", "port",
    "address", "sentinel_master", "queue", "secret", "SSL_CERT_REQS", "shipped", "SHIPPED_VALUES",
    "url_password", "networks", "parse_duration", "spoken_duration",
]

T = TypeVar("T")


class SettingsError(ValueError):
    """A setting has a value the platform cannot run with; the message names the variable."""


# Query parameters whose value is a credential (`?password=`, `sslpassword=`, `token=`...).
_SECRET_PARAM = re.compile(r"([?&;][^=&#;]*(?:pass|pwd|secret|token)[^=&#;]*=)[^&#;]*", re.I)


def value(env: Mapping[str, str], name: str) -> str:
    """The raw value of setting `name` in `env`, stripped: the variable itself, or the contents
    of the file its `NAME_FILE` variable names (Docker and Kubernetes secrets mounted as files).
    Both set, or a file that cannot be read, is a `SettingsError` naming the variable."""
    path = env.get(f"{name}_FILE", "").strip()
    raw = env.get(name, "").strip()
    if not path:
        return raw
    if raw:
        raise SettingsError(f"{name} and {name}_FILE are both set: set one of them")
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except OSError as exc:
        raise SettingsError(f"{name}_FILE={path!r}: cannot read it "
                            f"({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{name}_FILE={path!r}: cannot read it (not UTF-8 text)") from None


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


# Credentials that ship in this repository's examples (deploy/, docker-compose.yml, the README,
# the k8s Secret once shipped) or are the usual placeholders: public, so never a secret.
# Compared case-insensitively; a value containing one of the markers is refused too.
SHIPPED_VALUES = frozenset({
    "change-me", "changeme", "change-me-to-32-random-bytes-or-more-0123456789",
    "a long password", "pw", "password", "secret", "admin", "rangekeeper",
})
_PLACEHOLDER_MARKERS = ("change-me", "changeme", "change_me", "replace-me", "replaceme",
                        "replace_me", "placeholder", "your-password", "your-secret")


def shipped(value: str) -> bool:
    """Whether `value` is a credential anyone can read: shipped in this repository's examples
    or a known placeholder (`SHIPPED_VALUES`, or containing a placeholder marker)."""
    folded = value.strip().lower()
    return folded in SHIPPED_VALUES or any(m in folded for m in _PLACEHOLDER_MARKERS)


def url_password(url: str) -> str | None:
    """The password in `url`'s authority (percent-decoded), or None; parsed like `redact`
    (the authority ends at the last `@`)."""
    _, sep, rest = url.partition("://")
    userinfo, at, _ = rest.rpartition("@")
    if not (sep and at and ":" in userinfo):
        return None
    return unquote(userinfo.split(":", 1)[1])


def _refuse_shipped_password(name: str, raw: str) -> None:
    for one in raw.split(";"):  # a sentinel:// list
        password = url_password(one)
        if password is not None and shipped(password):
            raise SettingsError(
                f"{name}={redact(raw)!r} has a password shipped with rangekeeper's examples "
                "(or a known placeholder): anyone can read it; set the real one")


def url(schemes: tuple[str, ...]) -> Callable[[str, str], str]:
    """A URL whose scheme is one of `schemes` (rediss:// must say how to check certificates)."""
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
            check(name, raw, redisconn.parse_sentinel_url)
        _refuse_shipped_password(name, raw)
        return raw

    return parse


def check(name: str, raw: str, parse: Callable[[str], object]) -> None:
    """Run `parse(raw)`; its ValueError becomes a SettingsError naming `name`."""
    try:
        parse(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={redact(raw)!r}: {exc}") from None


def cluster_nodes(name: str, raw: str) -> tuple[str, ...]:
    """REDIS_CLUSTER_NODES: `host:port,...`, the cluster's seed nodes."""
    check(name, raw, redisconn.parse_cluster_nodes)
    return redisconn.parse_cluster_nodes(raw)


def db_zero(url: str) -> None:
    """A Redis Cluster has database 0 only."""
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


def url_list(schemes: tuple[str, ...]) -> Callable[[str, str], tuple[str, ...]]:
    """A comma-separated list of `url(schemes)`, no empty entry."""
    one = url(schemes)

    def parse(name: str, raw: str) -> tuple[str, ...]:
        urls = tuple(part.strip() for part in raw.split(","))
        if any(not url for url in urls):
            raise SettingsError(f"{name} must be a comma-separated list of URLs, "
                                "with no empty entry")
        return tuple(one(name, url) for url in urls)

    return parse


def flag(name: str, raw: str) -> bool:
    """1/0, true/false, yes/no, on/off."""
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} must be 1 or 0 (true/false, yes/no, on/off)")


def database_url(name: str, raw: str) -> str:
    """A URL SQLAlchemy can parse."""
    try:
        make_url(raw)
    except ArgumentError as exc:
        raise SettingsError(f"{name}={redact(raw)!r} is not a SQLAlchemy URL: {exc}") from None
    _refuse_shipped_password(name, raw)
    return raw


def modules(name: str, raw: str) -> tuple[str, ...]:
    """A comma-separated list of dotted module names."""
    modules = tuple(part.strip() for part in raw.split(","))
    for module in modules:
        if not _MODULE.fullmatch(module):
            raise SettingsError(f"{name}: {module[:64]!r} is not a dotted module name")
    return modules


_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def identifier(name: str, raw: str) -> str:
    """A lower-case SQL identifier (a schema name), used unquoted-safe in DDL."""
    if not IDENTIFIER.match(raw):
        raise SettingsError(f"{name}={raw[:80]!r} must match {IDENTIFIER.pattern} (a lower-case "
                            "SQL identifier)")
    return raw


def one_of(*choices: str) -> Callable[[str, str], str]:
    """One of `choices`, exactly."""
    def parse(name: str, raw: str) -> str:
        if raw not in choices:
            raise SettingsError(f"{name}={raw[:32]!r} must be one of {', '.join(choices)}")
        return raw

    return parse


def some_of(*choices: str) -> Callable[[str, str], tuple[str, ...]]:
    """A comma-separated list of `choices` (each at most once), or `none`."""
    def parse(name: str, raw: str) -> tuple[str, ...]:
        if raw.strip() == "none":
            return ()
        found = tuple(part.strip() for part in raw.split(","))
        for part in found:
            if part not in choices:
                raise SettingsError(f"{name}: {part[:32]!r} is not one of "
                                    f"{', '.join(choices)} (a comma-separated list, or none)")
        return tuple(sorted(set(found), key=choices.index))

    return parse


def fraction(name: str, raw: str) -> float:
    """A number from 0 to 1."""
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw[:32]!r} is not a number") from None
    if not 0 <= value <= 1:
        raise SettingsError(f"{name}={raw[:32]!r} must be from 0 to 1")
    return value


def at_least(cast: Callable[[str], T], minimum: float) -> Callable[[str, str], T]:
    """A number (`cast`) of at least `minimum`."""
    def parse(name: str, raw: str) -> T:
        try:
            value = cast(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw[:32]!r} is not a number") from None
        if not value >= minimum:  # type: ignore[operator]
            raise SettingsError(f"{name}={raw[:32]!r} must be at least {minimum:g}")
        return value

    return parse


def positive(cast: Callable[[str], T]) -> Callable[[str, str], T]:
    """A number (`cast`) greater than 0."""
    def parse(name: str, raw: str) -> T:
        try:
            value = cast(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not a number") from None
        if not value > 0:  # type: ignore[operator]
            raise SettingsError(f"{name}={raw!r} must be greater than 0")
        return value

    return parse


def port(name: str, raw: str) -> int:
    """A TCP port, 1-65535."""
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SettingsError(f"{name}={raw!r} must be a TCP port (1-65535)")
    return int(raw)


def address(name: str, raw: str) -> str:
    """An IP address to bind (IPv4 or IPv6)."""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise SettingsError(f"{name}={raw!r} must be an IP address (e.g. 127.0.0.1)") from None


def networks(name: str, raw: str) -> tuple[str, ...]:
    """A comma-separated list of IP addresses or networks (`10.0.0.0/8`), no empty entry."""
    found = []
    for part in (p.strip() for p in raw.split(",")):
        try:
            found.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise SettingsError(f"{name}: {part[:64]!r} is not an IP address or network "
                                "(e.g. 10.0.0.7 or 10.0.0.0/8)") from None
    return tuple(found)


def sentinel_master(name: str, raw: str) -> str:
    """The name the sentinels monitor a master under."""
    if not _MASTER_NAME.fullmatch(raw):
        raise SettingsError(f"{name}={raw[:64]!r} must be a master name (letters, digits, "
                            "'.', '-', '_')")
    return raw


_MASTER_NAME = re.compile(r"[\w.-]{1,128}")


def queue(name: str, raw: str) -> str:
    """A queue name: letters, digits, '.', '-', '_'."""
    if not _MASTER_NAME.fullmatch(raw):
        raise SettingsError(f"{name}={raw[:64]!r} must be a queue name (letters, digits, "
                            "'.', '-', '_')")
    return raw


def secret(name: str, raw: str) -> str:
    """A signing secret of at least 32 characters."""
    if len(raw) < 32:
        raise SettingsError(f"{name} must be at least 32 characters (it signs session cookies)")
    return raw


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in `7d`, `12h`, `30m` or `45s`; ValueError naming the accepted forms (the CLI's
    `--older-than` and the console's purge form read an operator's duration with it)."""
    found = _DURATION.match(text)
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration: use a positive number followed by "
                         "s, m, h or d (e.g. 7d, 12h, 30m)")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def spoken_duration(seconds: float) -> str:
    """`seconds` in the largest unit that divides it (604800 -> 7d): `parse_duration` back."""
    for unit, size in sorted(_UNIT_S.items(), key=lambda item: -item[1]):
        if seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
