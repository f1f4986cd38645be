"""A TCP proxy on loopback that injects network faults between the platform and its Redis.

    proxy = FaultProxy(listen_port=6600, upstream_port=6500).start()
    proxy.latency(0.2)        # every chunk, each way, waits 200 ms (order kept)
    proxy.cut()               # every open connection is reset; new ones are accepted
    proxy.blackhole(True)     # bytes are held, nothing answers: a partition
    proxy.blackhole(False)    # the partition ends: connections it caught are reset
    proxy.strand()            # open connections go half-open: bytes vanish, nothing closes
    proxy.heal(); proxy.stop()

A black hole holds bytes instead of dropping them (dropping would corrupt a stream TCP keeps
ordered) and resets, when it lifts, every connection it caught: a partition that outlasts TCP's
patience ends the same way, and nothing held is delivered late. Threads, one pair a connection:
the platform's few dozen connections need nothing faster.

A stranded connection is the other way a link dies: a NAT or load balancer forgot it, or the
far host vanished, and nothing tells the client. Its bytes are dropped, nothing comes back and
nothing is reset; only a client's own timeouts end it. New connections pass as before.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

__all__ = ["FaultProxy"]

CHUNK = 65536
POLL_S = 0.05


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.closed = threading.Event()
        self.stranded = threading.Event()  # half-open: bytes dropped both ways, never closed

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            try:
                # RST, not FIN: how the peer sees a partition end a connection
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            except OSError:
                pass


class FaultProxy:
    """Forward 127.0.0.1:`listen_port` to 127.0.0.1:`upstream_port`, with faults on demand."""

    def __init__(self, listen_port: int, upstream_port: int) -> None:
        self.listen_port, self.upstream_port = listen_port, upstream_port
        self._delay = 0.0
        self._holding = threading.Event()
        self._pairs: set[_Pair] = set()
        self._caught: set[_Pair] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._server: socket.socket | None = None

    def start(self) -> FaultProxy:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.listen_port))
        server.listen(256)
        server.settimeout(POLL_S * 4)
        self._server = server
        threading.Thread(target=self._accept, name="faultproxy-accept", daemon=True).start()
        return self

    # faults ------------------------------------------------------------------------------

    def latency(self, seconds: float) -> None:
        """Delay every chunk by `seconds` each way (0: none)."""
        self._delay = max(seconds, 0.0)

    def cut(self) -> int:
        """Reset every open connection; return how many."""
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            pair.close()
        return len(pairs)

    def blackhole(self, on: bool) -> None:
        """Hold every byte (on); lifting it resets every connection it caught."""
        if on:
            with self._lock:
                self._caught = set(self._pairs)
            self._holding.set()
            return
        with self._lock:
            caught, self._caught = self._caught | self._pairs, set()
            self._pairs -= caught
        self._holding.clear()
        for pair in caught:
            pair.close()

    def strand(self) -> int:
        """Make every open connection half-open (bytes dropped, never closed); return how
        many. New connections are forwarded as before."""
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.stranded.set()
        return len(pairs)

    def heal(self) -> None:
        self.latency(0.0)
        if self._holding.is_set():
            self.blackhole(False)

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.close()
        self.cut()

    # forwarding --------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        while self._holding.is_set() and not self._stopped.is_set():
            time.sleep(POLL_S)  # a partition: the connection waits, as a SYN would
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
        except OSError:
            client.close()  # Redis is down: the client sees a refused/reset connection
            return
        pair = _Pair(client, upstream)
        with self._lock:
            self._pairs.add(pair)
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(pair, src, dst), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            src.settimeout(None)
            while not pair.closed.is_set():
                data = src.recv(CHUNK)
                if not data:
                    break
                while self._holding.is_set() and not pair.closed.is_set():
                    time.sleep(POLL_S)
                if self._delay:
                    time.sleep(self._delay)
                if pair.closed.is_set():
                    break
                if not pair.stranded.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._pairs.discard(pair)
        pair.close()
