"""The scratch Redis a benchmark runs on, flushed before use.

    try:
        scratch = open_scratch(BENCH_REDIS_DB)   # or: with scratch_redis(db) as redis_url:
    except NotScratch as exc:
        ...                                      # print it, exit 2: nothing was touched
    try:
        ...                                      # scratch.url: REDIS_URL for the workers
    finally:
        scratch.stop()

It is `devtools.embedded.demo_redis`'s choice (REDIS_URL if empty or already marked as a
scratch database, else database `db` of a local Redis on the same terms, else a private Redis
started now and stopped by `stop`); a database holding someone else's data raises
`NotScratch` and is left untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis

from devtools.embedded import EmbeddedRedis, NotScratch, demo_redis, flush_scratch

__all__ = ["Scratch", "open_scratch", "scratch_redis", "flush", "NotScratch"]


def flush(redis_url: str) -> None:
    """Empty the scratch database at `redis_url` (its scratch marker stays)."""
    client = redis.Redis.from_url(redis_url)
    try:
        flush_scratch(client)
    finally:
        client.close()


@dataclass
class Scratch:
    """A claimed, flushed scratch database; `stop` ends the private Redis if one was started."""

    url: str
    embedded: EmbeddedRedis | None

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def open_scratch(db: int) -> Scratch:
    """Claim and flush a scratch Redis database (see the module docstring)."""
    url, embedded = demo_redis(db, "bench")
    scratch = Scratch(url, embedded)
    try:
        flush(url)
    except BaseException:
        scratch.stop()
        raise
    return scratch


@contextmanager
def scratch_redis(db: int) -> Iterator[str]:
    """`open_scratch` as a context manager yielding the URL."""
    scratch = open_scratch(db)
    try:
        yield scratch.url
    finally:
        scratch.stop()
