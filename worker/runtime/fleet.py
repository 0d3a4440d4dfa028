"""The workers as the broker sees them: who answers a ping, which queues each consumes, and
so which kinds (evaluate, summarize) are served. For ``compactor status``, ``up``, ``/readyz``
and :func:`worker.local.local_stack`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from worker.config import (
    Settings,
    with_redis_url,
)


@contextmanager
def broker_errors(action: str) -> Iterator[None]:
    """Kombu raises redis-py's errors wrapped in its OperationalError (a refused password too):
    converted here, where they enter, into the error tree the same way as every other Redis
    error (worker.backend.connection.redis_errors); RabbitMQ's (py-amqp's) as the client's sender
    converts them (worker.backend.queues.converted_broker_error)."""
    import redis
    from kombu.exceptions import OperationalError

    from worker.backend.connection import redis_errors
    from worker.backend.queues import converted_broker_error

    with redis_errors(action):
        try:
            yield
        except OperationalError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, redis.exceptions.RedisError):
                raise cause from None  # converted by redis_errors
            raise converted_broker_error(cause or exc, action) from None


def ping(app: Any, *, timeout_s: float) -> list[dict[str, Any]]:
    """The workers' replies to a broadcast ping."""
    with broker_errors("pinging the workers"):
        replies: list[dict[str, Any]] = app.control.ping(timeout=timeout_s) or []
    return replies


def active_queues(app: Any, *, timeout_s: float) -> dict[str, Any]:
    """Each answering worker's consumed queues, by node name."""
    with broker_errors("asking the workers for their queues"):
        active: dict[str, Any] = app.control.inspect(timeout=timeout_s).active_queues() or {}
    return active


def wait_for_workers(
    url: str,
    settings: Settings,
    expected: int,
    timeout_s: float,
    *,
    stop: Callable[[], bool] = lambda: False,
) -> bool:
    """Whether ``expected`` workers answer a ping within ``timeout_s`` (False at once when
    ``stop()`` says to give up)."""
    from worker.runtime.celery_app import make_app

    app = make_app(with_redis_url(settings, url))
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not stop():
            replies = ping(app, timeout_s=1.0)
            if len(replies) >= expected:
                return True
        return False
    finally:
        app.close()


#: What makes a worker one of each kind: it consumes the kind's queue (``compactor up`` names
#: them ``evaluate@host`` and ``summarize@host``; ``compactor worker`` nodes count by queue, and
#: one consuming every queue counts for every kind).
KIND_QUEUES = {"evaluate": "compactor.evaluate", "summarize": "compactor.summarize"}


def classify_workers(active_queues: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    """``{kind: [node, ...]}`` from ``inspect().active_queues()``'s ``{node: [queue, ...]}``."""
    kinds: dict[str, list[str]] = {kind: [] for kind in KIND_QUEUES}
    for node, queues in sorted(active_queues.items()):
        names = {q.get("name") for q in queues or [] if isinstance(q, dict)}
        for kind, queue in KIND_QUEUES.items():
            if queue in names:
                kinds[kind].append(node)
    return kinds
