"""A real OTLP/HTTP receiver on loopback: what an OpenTelemetry collector's ``otlphttp``
receiver accepts (``POST /v1/traces`` and ``/v1/metrics``, binary protobuf, gzip or not),
decoded with the protocol's own classes (``opentelemetry-proto``) and kept for the test."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

# opentelemetry.proto.trace.v1.Span.SpanKind
KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a trace's root
    name: str
    kind: str
    attributes: dict[str, Any]
    service: str  # the resource's service.name: which program sent it
    status_code: int  # 0 unset, 1 ok, 2 error


@dataclass(frozen=True)
class ReceivedPoint:
    metric: str
    attributes: dict[str, Any]
    count: int  # a histogram point's count; a sum's value for a counter
    bucket_counts: list[int]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class OtlpReceiver:
    """``with OtlpReceiver() as otlp:``: listening on ``otlp.endpoint`` until the block ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._points: list[ReceivedPoint] = []
        self.requests: list[str] = []  # the paths posted to, in order
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(415)
                    return
                if self.path == "/v1/traces":
                    answer = receiver._traces(body)
                elif self.path == "/v1/metrics":
                    answer = receiver._metrics(body)
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                del format, args

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _traces(self, body: bytes) -> bytes:
        request = ExportTraceServiceRequest.FromString(body)
        with self._lock:
            self.requests.append("/v1/traces")
            for resource_spans in request.resource_spans:
                service = _attributes(resource_spans.resource.attributes).get("service.name", "")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self._spans.append(
                            ReceivedSpan(
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                name=span.name,
                                kind=KINDS.get(span.kind, str(span.kind)),
                                attributes=_attributes(span.attributes),
                                service=service,
                                status_code=span.status.code,
                            )
                        )
        return ExportTraceServiceResponse().SerializeToString()

    def _metrics(self, body: bytes) -> bytes:
        request = ExportMetricsServiceRequest.FromString(body)
        with self._lock:
            self.requests.append("/v1/metrics")
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        self._points.extend(_points(metric))
        return ExportMetricsServiceResponse().SerializeToString()

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    @property
    def points(self) -> list[ReceivedPoint]:
        with self._lock:
            return list(self._points)

    def wait_for(
        self, found: Callable[[OtlpReceiver], bool], *, what: str, timeout_s: float = 60.0
    ) -> None:
        """Until ``found(self)`` holds (the exporters send in batches, every interval)."""
        deadline = time.monotonic() + timeout_s
        while not found(self):
            if time.monotonic() > deadline:
                names = sorted({s.name for s in self.spans})
                raise AssertionError(f"no {what} within {timeout_s}s; spans so far: {names}")
            time.sleep(0.05)


def _points(metric: Any) -> list[ReceivedPoint]:
    kind = metric.WhichOneof("data")
    if kind == "histogram":
        return [
            ReceivedPoint(
                metric.name, _attributes(p.attributes), int(p.count), list(p.bucket_counts)
            )
            for p in metric.histogram.data_points
        ]
    if kind == "sum":
        return [
            ReceivedPoint(metric.name, _attributes(p.attributes), int(p.as_int), [])
            for p in metric.sum.data_points
        ]
    return []
