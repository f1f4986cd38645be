"""The tests' private redis-server (tests/support/redis_server.py): a port that another test
process took between the choice and the bind is not mistaken for ours."""

from __future__ import annotations

import socket
import threading

import pytest
import redis

from tests.support import redis_server
from tests.support.ports import free_port


def test_a_server_whose_port_was_taken_starts_on_another_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another test's proxy holds the first port chosen and closes every connection (what a
    busy run met): the server exits there, and starts on the next port chosen."""
    taken = free_port()
    listener = socket.create_server(("127.0.0.1", taken))
    stop = threading.Event()

    def close_each() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.close()

    closer = threading.Thread(target=close_each, daemon=True)
    closer.start()
    ports = iter([taken, free_port()])
    monkeypatch.setattr(redis_server, "free_port", lambda: next(ports))
    server = redis_server.RedisServer()
    try:
        server.start()
        assert server.port != taken
        client = redis.Redis(port=server.port)
        assert server.proc is not None
        assert int(client.info("server")["process_id"]) == server.proc.pid
        client.close()
        server.restart()  # a restart keeps its port
        assert server.port != taken and server.proc.poll() is None
    finally:
        server.kill()
        stop.set()
        closer.join()
        listener.close()
