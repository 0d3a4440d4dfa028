"""OpenTelemetry's telemetry: spans and metrics sent over OTLP/HTTP (the ``otel`` extra).

Imported only by :func:`worker.ops.tracing.telemetry` when ``[otel] endpoint`` is set. The
providers are this object's own, not OpenTelemetry's global ones: an agent that configured
OpenTelemetry for itself keeps its providers, and its current span still becomes the parent
of our submit span (the context is OpenTelemetry's, shared through its context API).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from worker.config import OtelConfig
from worker.ops.metrics import LATENCY_BUCKETS_S
from worker.ops.tracing import AttributeValue, SpanKind, Stage, Telemetry

__all__ = ["OtelTelemetry"]

_KINDS = {
    "internal": trace.SpanKind.INTERNAL,
    "client": trace.SpanKind.CLIENT,
    "producer": trace.SpanKind.PRODUCER,
    "consumer": trace.SpanKind.CONSUMER,
}
STAGE_DURATION = "compactor.stage.duration"
TOKENS_SAVED = "compactor.tokens.saved"


class _SpanStage(Stage):
    def __init__(self, name: str, span: trace.Span) -> None:
        super().__init__(name)
        self._span = span

    def set(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        self._span.set_attributes(_present(attributes))

    def fail(self, reason: str) -> None:
        self._span.set_status(Status(StatusCode.ERROR, reason))


class OtelTelemetry(Telemetry):
    """Spans batched and sent to ``<endpoint>/v1/traces``, the stage histograms and the
    tokens saved read every ``export_interval_s`` and sent to ``<endpoint>/v1/metrics``."""

    enabled = True

    def __init__(self, config: OtelConfig) -> None:
        assert config.endpoint is not None
        base = config.endpoint.get_secret_value().rstrip("/")
        resource = Resource.create(
            {"service.name": config.service_name, "service.version": _our_version()}
        )
        interval_ms = config.export_interval_s * 1000
        timeout_s = config.export_timeout_s
        self._traces = TracerProvider(
            resource=resource, sampler=ParentBased(TraceIdRatioBased(config.sampling_ratio))
        )
        self._traces.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=timeout_s),
                schedule_delay_millis=interval_ms,
            )
        )
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics", timeout=timeout_s),
            export_interval_millis=interval_ms,
        )
        self._metrics = MeterProvider(
            resource=resource,
            metric_readers=[reader],
            views=[
                View(
                    instrument_name=STAGE_DURATION,
                    aggregation=ExplicitBucketHistogramAggregation(LATENCY_BUCKETS_S),
                )
            ],
        )
        self._tracer = self._traces.get_tracer("worker", _our_version())
        meter = self._metrics.get_meter("worker", _our_version())
        self._durations = meter.create_histogram(
            STAGE_DURATION, unit="s", description="Seconds per stage of a snapshot's path."
        )
        self._saved = meter.create_counter(
            TOKENS_SAVED, unit="{token}", description="Tokens the published compactions saved."
        )
        self._propagator = TraceContextTextMapPropagator()
        self._closed = threading.Event()

    @contextlib.contextmanager
    def _span(
        self,
        name: str,
        kind: SpanKind,
        parent: Mapping[str, str] | None,
        attributes: Mapping[str, AttributeValue | None],
    ) -> Iterator[Stage]:
        # A remote parent: the context the headers carry ({} or none valid: a new trace).
        context = self._propagator.extract(dict(parent)) if parent is not None else None
        with self._tracer.start_as_current_span(
            name, context=context, kind=_KINDS[kind], attributes=_present(attributes)
        ) as span:
            yield _SpanStage(name, span)

    def carrier(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        self._propagator.inject(headers)
        return headers

    def record(self, stage: str, seconds: float, labels: Mapping[str, str]) -> None:
        attributes = {"compactor.stage": stage} | {f"compactor.{k}": v for k, v in labels.items()}
        self._durations.record(seconds, attributes)

    def add_tokens_saved(self, tokens: int) -> None:
        self._saved.add(max(tokens, 0))

    def shutdown(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._traces.shutdown()  # exports the spans still batched
        self._metrics.shutdown()


def _present(attributes: Mapping[str, AttributeValue | None]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}


def _our_version() -> str:
    try:
        return version("compaction-worker")
    except PackageNotFoundError:
        return "unknown"
