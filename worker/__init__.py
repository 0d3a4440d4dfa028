"""compaction-worker: conversation compaction for LLM agents, off the agent's critical path.

What an agent uses most, by its short name: ``from worker import Client, CompactingSession,
CompletedEvent``. Each name is resolved on first use, from the module it lives in (so that
``import worker`` imports no Celery, Redis client or HTTP server, and ``apply_compaction`` or
an event type costs no Redis client either); ``worker.client``, ``worker.session``,
``worker.local``, ``worker.testing`` and ``worker.integrations.*`` are the modules behind them.

``celery -A worker worker`` finds the Celery app as ``worker.app``; it is imported lazily too,
so that the CLI and the pure core never pay for importing Celery.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from worker.client import Client, project
    from worker.errors import (
        BrokerUnavailable,
        CompactorError,
        ConfigError,
        EventMismatch,
        InvalidSnapshot,
        PermanentError,
        RedisUnavailable,
        StorageError,
        TransientError,
    )
    from worker.local import local_stack
    from worker.session import AsyncCompactingSession, CompactingSession
    from worker.wire.events import (
        CompactionEvent,
        CompletedEvent,
        ElidedEvent,
        FailedEvent,
        OtherEvent,
        RejectedEvent,
        SkippedEvent,
        parse_event,
    )
    from worker.wire.history import apply_compaction

__version__ = "0.1.0"

__all__ = [
    "AsyncCompactingSession",
    "BrokerUnavailable",
    "Client",
    "CompactingSession",
    "CompactionEvent",
    "CompactorError",
    "CompletedEvent",
    "ConfigError",
    "ElidedEvent",
    "EventMismatch",
    "FailedEvent",
    "InvalidSnapshot",
    "OtherEvent",
    "PermanentError",
    "RedisUnavailable",
    "RejectedEvent",
    "SkippedEvent",
    "StorageError",
    "TransientError",
    "__version__",
    "apply_compaction",
    "local_stack",
    "parse_event",
    "project",
]

# Where each name lives: the cheapest module that has it.
_HOMES = {
    "Client": "worker.client",
    "project": "worker.client",
    "CompactingSession": "worker.session",
    "AsyncCompactingSession": "worker.session",
    "local_stack": "worker.local",
    "apply_compaction": "worker.wire.history",
    **dict.fromkeys(
        [
            "CompactionEvent",
            "CompletedEvent",
            "ElidedEvent",
            "FailedEvent",
            "OtherEvent",
            "RejectedEvent",
            "SkippedEvent",
            "parse_event",
        ],
        "worker.wire.events",
    ),
    **dict.fromkeys(
        [
            "BrokerUnavailable",
            "CompactorError",
            "ConfigError",
            "EventMismatch",
            "InvalidSnapshot",
            "PermanentError",
            "RedisUnavailable",
            "StorageError",
            "TransientError",
        ],
        "worker.errors",
    ),
}


def __getattr__(name: str) -> typing.Any:
    if name in ("app", "celery"):  # for ``celery -A worker``; not part of __all__
        from worker.runtime.celery_app import app

        return app
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'worker' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
