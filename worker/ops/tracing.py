"""A snapshot's stages, timed and traced: OpenTelemetry when configured, else only the timing.

:func:`worker.ops.telemetry.telemetry` builds one :class:`Telemetry` per process from the
settings; its owner passes it down (the client holds it, the worker's pipeline has it among its
adapters), so nothing is kept in a module global. Unconfigured it is the base class here, which
imports nothing of OpenTelemetry: a stage costs a ``perf_counter`` pair, and its seconds still
feed the Prometheus histograms (:func:`worker.ops.metrics.latency_counters`). Configured
(``[otel] endpoint``, or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``) it is
:class:`worker.ops.otel.OtelTelemetry`, imported only then: each stage is a span, and its
seconds an OpenTelemetry histogram too.

The trace context crosses the Celery hop as W3C ``traceparent`` / ``tracestate`` headers of
the task message: :meth:`Telemetry.carrier` on the sending side, ``parent`` of
:meth:`Telemetry.stage` on the receiving side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from time import perf_counter
from typing import Literal

from worker.ops.metrics import latency_counters

__all__ = [
    "TRACE_HEADERS",
    "AttributeValue",
    "SpanKind",
    "Stage",
    "Telemetry",
]

AttributeValue = str | bool | int | float
SpanKind = Literal["internal", "client", "producer", "consumer"]

#: The W3C trace context headers a task message may carry.
TRACE_HEADERS = ("traceparent", "tracestate")


class Stage:
    """One running stage: attributes may be added while it runs; ``seconds`` once it ended.
    This one records nothing beyond its time (OpenTelemetry's adds to its span)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = 0.0

    def set(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        """Attributes of the stage's span (None values are left out)."""
        del attributes

    def fail(self, reason: str) -> None:
        """Mark the stage failed without an exception (a ``compaction.failed`` outcome)."""
        del reason


class Telemetry:
    """Stages timed, and nothing else: the telemetry of a process with no ``[otel]``."""

    enabled = False

    @contextlib.contextmanager
    def stage(
        self,
        name: str,
        *,
        span_name: str | None = None,
        kind: SpanKind = "internal",
        parent: Mapping[str, str] | None = None,
        attributes: Mapping[str, AttributeValue | None] | None = None,
        labels: Mapping[str, str] | None = None,
        into: dict[str, float] | None = None,
    ) -> Iterator[Stage]:
        """Time (and trace) the block as stage ``name``: a span ``span_name`` (default
        ``compactor.<name>``), a child of the current span, or of the remote span ``parent``
        names (W3C headers; ``{}``: a new trace). ``labels``: the histograms' labels besides
        the stage (bounded values only). ``into``: counters to which the stage's Prometheus
        histogram observation is added, for the caller to write to Redis."""
        with self._span(span_name or f"compactor.{name}", kind, parent, attributes or {}) as stage:
            started = perf_counter()
            try:
                yield stage
            finally:
                stage.seconds = perf_counter() - started
                self.record(name, stage.seconds, labels or {})
                if into is not None:
                    for counter, amount in latency_counters(name, stage.seconds, labels).items():
                        into[counter] = into.get(counter, 0.0) + amount

    @contextlib.contextmanager
    def _span(
        self,
        name: str,
        kind: SpanKind,
        parent: Mapping[str, str] | None,
        attributes: Mapping[str, AttributeValue | None],
    ) -> Iterator[Stage]:
        del kind, parent, attributes
        yield Stage(name)

    def carrier(self) -> dict[str, str]:
        """The current span's trace context as message headers (``{}``: nothing to carry)."""
        return {}

    def record(self, stage: str, seconds: float, labels: Mapping[str, str]) -> None:
        """One observation of the stage's latency histogram (OpenTelemetry's; Prometheus' go
        through Redis: ``into`` of :meth:`stage`)."""
        del stage, seconds, labels

    def add_tokens_saved(self, tokens: int) -> None:
        """Tokens a published compaction took off the next request."""
        del tokens

    def shutdown(self) -> None:
        """Export what is buffered and stop (idempotent)."""
