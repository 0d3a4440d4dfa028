"""Structured logs: one JSON object per line, with the conversation id, revision, event id and
outcome when the code logging knows them (pass them in ``extra``). Secrets are never passed to
a logger; URLs are masked before they are."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime

from worker.errors import ConfigError

LEVEL_ENV = "COMPACTOR_LOG_LEVEL"
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING}
_LEVELS |= {"WARN": logging.WARNING, "ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL}

CONTEXT_FIELDS = (
    "conversation_id",
    "revision",
    "event_id",
    "outcome",
    "removed",
    "count",
    "task_id",
    "queue",
    "field",
    "reason",
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                doc[field] = value
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def configure_logging(level: str | int = "INFO", *, fmt: str = "json") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)


def level_from_env(default: str, environ: Mapping[str, str] | None = None) -> int:
    """The level ``COMPACTOR_LOG_LEVEL`` names (else ``default``); ConfigError for another."""
    env = os.environ if environ is None else environ
    name = env.get(LEVEL_ENV, "").strip().upper() or default
    if name not in _LEVELS:
        raise ConfigError(LEVEL_ENV, "must be one of debug, info, warning, error, critical")
    return _LEVELS[name]
