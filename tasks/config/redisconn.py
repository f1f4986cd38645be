"""One way to build a redis-py client from the URL forms users already write.

    redis_client("redis://:pw@host:6379/0")                         -> redis.Redis
    redis_client("redis://:pw@", cluster_nodes=("h1:7000", "h2:7000"))
                                                                     -> RedisCluster (seeds)
    redis_client("sentinel://h1:26379;sentinel://h2:26379", sentinel_master="mymaster")
                                                                     -> Sentinel master client

A Sentinel URL list is Celery's own broker syntax (``sentinel://`` entries separated by ``;``):
the password and database of the first entry are the master's (as kombu reads them), and the
client it gives asks the sentinels for the master again after a failover. Errors raised here
are `ValueError`s that never quote a URL (a URL may hold a password); `tasks.config.settings` adds
the variable's name and a redacted copy.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

__all__ = ["redis_client", "is_sentinel", "parse_cluster_nodes", "parse_sentinel_url",
           "SentinelURL", "url_db"]


def is_sentinel(url: str) -> bool:
    """True when `url` is a ``sentinel://`` URL list."""
    return url.strip().lower().startswith("sentinel://")


def _host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be host:port, e.g. 127.0.0.1:7000")
    return host, int(port)


def parse_cluster_nodes(raw: str) -> tuple[str, ...]:
    """The seed nodes of a comma-separated ``host:port,host:port`` list, each checked."""
    nodes = tuple(part.strip() for part in raw.split(","))
    for node in nodes:
        if not node:
            raise ValueError("must be a comma-separated list of host:port, with no empty entry")
        _host_port(node, f"every entry ({node[:64]!r})")
    return nodes


def _split(url: str) -> SplitResult:
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        raise ValueError("is not a valid URL") from None
    return parts


def _path_db(parts: SplitResult) -> int:
    path = parts.path.strip("/")
    if not path:
        return 0
    if not path.isdigit():
        raise ValueError("names a database that is not a number")
    return int(path)


def url_db(url: str) -> int:
    """The database a redis:// or sentinel:// URL names: its path, else ``?db=``, else 0."""
    parts = _split(url.split(";", 1)[0])
    query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
    if parts.path.strip("/"):
        return _path_db(parts)
    if "db" in query:
        if not query["db"].isdigit():
            raise ValueError("names a database that is not a number")
        return int(query["db"])
    return 0


class SentinelURL:
    """A parsed ``sentinel://h:p;sentinel://h:p`` list: the sentinels and the master's auth."""

    def __init__(self, nodes: list[tuple[str, int]], username: str | None,
                 password: str | None, db: int) -> None:
        self.nodes = nodes
        self.username = username
        self.password = password
        self.db = db


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse a Sentinel URL list; ValueError (quoting no URL) when an entry is malformed."""
    entries = [entry.strip() for entry in url.split(";")]
    nodes: list[tuple[str, int]] = []
    for entry in entries:
        parts = _split(entry)
        if parts.scheme.lower() != "sentinel" or not parts.hostname or parts.port is None:
            raise ValueError("must be sentinel://host:port entries separated by ';', e.g. "
                             "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379")
        nodes.append((parts.hostname, parts.port))
    first = _split(entries[0])
    return SentinelURL(
        nodes,
        unquote(first.username) if first.username else None,
        unquote(first.password) if first.password else None,
        url_db(url),
    )


def _cluster_client(url: str, nodes: tuple[str, ...], **kwargs: Any) -> RedisCluster:
    parts = _split(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError("with cluster nodes, the URL (for its password) must be redis:// "
                         "or rediss://")
    if url_db(url) != 0:
        raise ValueError("names a database other than 0: a Redis Cluster has only database 0")
    if parts.username:
        kwargs.setdefault("username", unquote(parts.username))
    if parts.password:
        kwargs.setdefault("password", unquote(parts.password))
    if parts.scheme == "rediss":
        kwargs.setdefault("ssl", True)
    # health_check_interval is a per-connection option RedisCluster accepts too; a cluster
    # client reconnects through the seeds after a failover or a slot move on its own.
    startup = [ClusterNode(*_host_port(node, "a cluster node")) for node in nodes]
    return RedisCluster(startup_nodes=startup, **kwargs)


def _sentinel_client(url: str, master: str | None, **kwargs: Any) -> redis.Redis:
    if not master:
        raise ValueError("a sentinel:// URL needs the master's name (SENTINEL_MASTER)")
    parsed = parse_sentinel_url(url)
    if parsed.username:
        kwargs.setdefault("username", parsed.username)
    if parsed.password:
        kwargs.setdefault("password", parsed.password)
    kwargs.setdefault("db", parsed.db)
    # The sentinels themselves get only the socket options (redis-py's default): the URL's
    # password is the master's, as kombu reads it.
    sentinel_kwargs = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    sentinel = Sentinel(parsed.nodes, sentinel_kwargs=sentinel_kwargs, **kwargs)
    return sentinel.master_for(master)


def redis_client(url: str, *, cluster_nodes: tuple[str, ...] = (),
                 sentinel_master: str | None = None, **kwargs: Any) -> redis.Redis | RedisCluster:
    """A redis-py client for one setting: a plain URL (redis.Redis), cluster seed nodes
    (RedisCluster; the URL gives only its password and must name db 0), or a Sentinel URL
    list with the master's name (a client that follows failovers). `kwargs` go to every
    connection (socket_timeout, decode_responses...)."""
    if cluster_nodes:
        if is_sentinel(url):
            raise ValueError("cluster nodes and a sentinel:// URL cannot both be given")
        return _cluster_client(url, cluster_nodes, **kwargs)
    if is_sentinel(url):
        return _sentinel_client(url, sentinel_master, **kwargs)
    return redis.Redis.from_url(url, **kwargs)
