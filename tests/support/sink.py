"""Fake external services for the visit-once tests, HTTP servers on 127.0.0.1: `sink` accepts
each idempotency key once, as a receiver that deduplicates by key does, and counts every
offer of each key (a retried batch offers its keys again); `fake_api` is a paginated API
over items 1..N (`GET ?after=ID&size=K`: the next K items and the cursor after them)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

__all__ = ["Sink", "sink", "fake_api"]


class Sink:
    """What the service saw: `offers` per key, and the keys it `accepted` (each once)."""

    def __init__(self) -> None:
        self.offers: Counter[str] = Counter()
        self.accepted: list[str] = []
        self.lock = threading.Lock()
        self.url = ""

    def offer(self, keys: list[str]) -> int:
        """Record an offer of `keys`; how many were new (accepted now)."""
        with self.lock:
            new = [k for k in keys if k not in self.offers]
            self.offers.update(keys)
            self.accepted.extend(new)
            return len(new)

    def snapshot(self) -> tuple[Counter[str], list[str]]:
        with self.lock:
            return Counter(self.offers), list(self.accepted)


@contextmanager
def sink() -> Iterator[Sink]:
    """A running `Sink` at `.url` (POST {"keys": [...]}), stopped on exit."""
    found = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            length = int(self.headers.get("Content-Length") or 0)
            body: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
            _reply(self, {"accepted": found.offer(list(body["keys"]))})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    with _serving(Handler) as url:
        found.url = f"{url}/offer"
        yield found


def _reply(handler: BaseHTTPRequestHandler, payload: dict[str, Any]) -> None:
    """Answer `payload` as JSON, 200."""
    reply = json.dumps(payload).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(reply)))
    handler.end_headers()
    handler.wfile.write(reply)


@contextmanager
def fake_api(count: int) -> Iterator[str]:
    """The URL of a paginated API over items 1..`count` ({"id", "name"}), stopped on exit."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            query = parse_qs(urlparse(self.path).query)
            after, size = int(query["after"][0]), int(query["size"][0])
            ids = list(range(after + 1, min(after + size, count) + 1))
            _reply(self, {"items": [{"id": i, "name": f"item-{i}"} for i in ids],
                          "next": ids[-1] if ids and ids[-1] < count else None})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    with _serving(Handler) as url:
        yield f"{url}/items"


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
