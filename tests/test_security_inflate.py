"""A compressed task message is inflated at most to MAX_MESSAGE_BYTES (issue 18 item 8).

kombu inflates a body whose message carries a `compression` header when it builds the message,
before any Celery code sees it; the receipt check used to measure the inflated body, so 64 KB of
zlib on the wire became 64 MB in the worker's main process. A real prefork worker gets real
bombs through the broker from a producer without the platform's limit: each is refused (failed
in the result backend, dead-lettered as oversized, acknowledged), the main process's peak
memory does not grow by the inflated size, and a small compressed message and the messages
sent after the bombs still run.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import redis
from sqlalchemy.orm import sessionmaker

from tasks.deadletters.store import DeadLetters
from tasks.store.resources import make_engine
from tasks.wings import load_settings
from tasks.worker.limits import (
    OVERSIZED_KIND,
    InflatesTooLarge,
    UnboundedCompression,
    inflate_bounded,
)
from tests.support.brokers import platform_client
from tests.support.db import fresh_database
from tests.support.workers import start_worker

MB = 1024 * 1024
INFLATED = 64 * MB  # each bomb's body once inflated
# The main process's peak resident memory may grow by this much while it refuses the bombs
# (a fraction of one bomb's inflated size).
PEAK_GROWTH_LIMIT = 16 * MB


def peak_rss(pid: int) -> int:
    """The process's peak resident set size in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _refuses_bombs(env: dict[str, str]) -> float:
    """Send three bombs and two good messages through `env`'s broker to a real worker; check
    what the module docstring says; return the main process's peak growth in bytes."""
    limit = load_settings(env).max_message_bytes
    body = json.dumps([["0" * INFLATED], {}, {}]).encode()
    assert len(zlib.compress(body)) < limit < INFLATED  # it passes the size check on the wire
    fresh_database(env["DATABASE_URL"]).dispose()
    worker = start_worker(env, 1)
    # A producer without the platform's limit (another service, an older client).
    foreign = platform_client(env)
    try:
        assert foreign.send_task("tasks.health.ping").get(timeout=60)["status"] == "ok"
        before = peak_rss(worker.pid)
        bombs = [foreign.send_task("tasks.health.ping", ["0" * INFLATED], compression=kind)
                 for kind in ("zlib", "bzip2", "lzma")]
        after_bombs = foreign.send_task("tasks.health.ping")
        small = foreign.send_task("devtools.samples.nap", [0.01], compression="zlib")
        for bomb in bombs:
            bomb.get(timeout=60, propagate=False)
            assert bomb.state == "FAILURE", bomb.state
            assert "exceeds MAX_MESSAGE_BYTES" in str(bomb.result)
            assert len(str(bomb.result)) < 400
        assert after_bombs.get(timeout=60)["status"] == "ok"
        assert small.get(timeout=60) == 0.01
        grown = peak_rss(worker.pid) - before
        log = worker.output()
    finally:
        foreign.close()
        worker.stop()
    assert grown < PEAK_GROWTH_LIMIT, f"the main process's peak grew by {grown / MB:.1f} MB"
    assert log.count("refused task tasks.health.ping") == len(bombs)
    assert max(len(line) for line in log.splitlines()) < 2000
    engine = make_engine(env["DATABASE_URL"])
    letters = DeadLetters(sessionmaker(engine)).list(OVERSIZED_KIND)
    engine.dispose()
    assert sorted(x.ref for x in letters) == sorted(b.id for b in bombs)
    for letter in letters:
        assert letter.payload["task"] == "tasks.health.ping"
        assert letter.payload["compression"] in ("application/x-gzip", "application/x-bz2",
                                                 "application/x-lzma")
        assert letter.payload["bytes"] < limit  # as it came on the wire
        assert len(json.dumps(letter.payload)) < 400
    print(f"peak growth of the worker's main process: {grown / MB:.1f} MB")
    return grown


@pytest.mark.timeout(240)
def test_compressed_bombs_are_refused_before_they_are_inflated_on_redis(
    worker_env: dict[str, str]
) -> None:
    _refuses_bombs(worker_env)
    client = redis.Redis.from_url(worker_env["REDIS_URL"])
    # Acknowledged: nothing waits for a redelivery after the visibility timeout.
    unacked = client.hlen("unacked")
    client.close()
    assert unacked == 0


@pytest.mark.timeout(240)
def test_compressed_bombs_are_refused_before_they_are_inflated_on_rabbitmq(
    worker_env: dict[str, str], amqp_url: str
) -> None:
    _refuses_bombs(dict(worker_env, BROKER_URL=amqp_url))


@pytest.mark.parametrize("compression", ["zlib", "gzip", "bzip2", "lzma", "xz"])
def test_a_body_inflates_up_to_the_limit_and_no_further(compression: str) -> None:
    from kombu.compression import compress

    limit = 1000
    for size in (0, 1, limit):
        body = bytes(range(256)) * 4
        packed, _ = compress(body[:size], compression)
        assert inflate_bounded(packed, compression, limit) == body[:size]
    packed, kind = compress(b"0" * (limit + 1), compression)
    with pytest.raises(InflatesTooLarge, match=r"exceeds MAX_MESSAGE_BYTES \(1,000\)"):
        inflate_bounded(packed, kind, limit)
    with pytest.raises(EOFError):
        inflate_bounded(packed[: len(packed) // 2], compression, 10 * limit)


@pytest.mark.parametrize("compression", ["bzip2", "lzma"])
def test_concatenated_streams_inflate_whole_and_count_towards_the_limit(
    compression: str
) -> None:
    from kombu.compression import compress

    one, _ = compress(b"a" * 600, compression)
    assert inflate_bounded(one + one, compression, 1200) == b"a" * 1200
    with pytest.raises(InflatesTooLarge):
        inflate_bounded(one + one, compression, 1199)


def test_a_compression_without_a_bounded_decompressor_is_refused_unread() -> None:
    with pytest.raises(UnboundedCompression, match="'application/zstd' cannot be inflated"):
        inflate_bounded(b"\x28\xb5\x2f\xfd" + b"x" * 100, "application/zstd", 1000)
