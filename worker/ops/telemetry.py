"""The process's telemetry, per ``[otel]`` (docs/observability.md)."""

from __future__ import annotations

from worker.config import Settings
from worker.errors import ConfigError
from worker.ops.tracing import Telemetry

__all__ = ["telemetry"]


def telemetry(settings: Settings) -> Telemetry:
    """OpenTelemetry's (imported now) when ``[otel] endpoint`` is set, else the timing-only
    :class:`~worker.ops.tracing.Telemetry`, which imports nothing of OpenTelemetry."""
    if settings.otel.endpoint is None:
        return Telemetry()
    try:
        from worker.ops.otel import OtelTelemetry
    except ImportError as exc:
        raise ConfigError(
            "otel.endpoint",
            f"needs the otel extra (pip install -e '.[otel]' in the checkout): {exc.name} "
            "is not installed",
        ) from None
    return OtelTelemetry(settings.otel)
