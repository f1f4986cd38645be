"""An OTLP/HTTP trace receiver on loopback: what a collector would get from a worker with
TRACING=1 and TRACING_EXPORTER=otlp (point OTEL_EXPORTER_OTLP_TRACES_ENDPOINT at `endpoint`).
It decodes each export request with OpenTelemetry's own protobuf classes and keeps the spans."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["Receiver", "Span"]


@dataclass
class Span:
    """One received span, ids in hex."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "int_value", "bool_value",
                                        "double_value") else str(v)


class Receiver:
    """A ThreadingHTTPServer on 127.0.0.1 taking OTLP/HTTP protobuf POSTs at /v1/traces."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = pb.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                answer = pb.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def _add(self, request: Any) -> None:
        found = [
            Span(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                 {a.key: _value(a.value) for a in s.attributes})
            for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        with self._lock:
            self._spans.extend(found)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def below(self, root: Span) -> list[Span]:
        """The spans received below `root` (its descendants), in the order received."""
        spans = [s for s in self.spans() if s.trace_id == root.trace_id]
        children: dict[str, list[Span]] = defaultdict(list)
        for s in spans:
            children[s.parent_id].append(s)
        found, todo = [], [root.span_id]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append(child)
                todo.append(child.span_id)
        return found

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
