"""Queue and task names, and sending a task message, without Celery.

The workers are Celery workers; what they consume are Celery task messages (protocol 2) on
plain queues. An agent process only ever sends one kind, "evaluate this conversation", so the
client builds that message itself with kombu (the messaging library Celery is built on) and
never imports Celery. docs/redis-protocol.md describes the message for other languages.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import uuid
from typing import Any

from worker.config import Settings, redis_url
from worker.errors import ConfigError, RedisUnavailable
from worker.redis_target import DEFAULT_REDIS_URL, is_shared_state_only

__all__ = [
    "EVALUATE_QUEUE",
    "EVALUATE_TASK",
    "MAINTENANCE_QUEUE",
    "QUEUES",
    "SUMMARIZE_QUEUE",
    "SUMMARIZE_TASK",
    "TaskSender",
    "broker_url",
    "task_message",
]

EVALUATE_QUEUE = "compactor.evaluate"
SUMMARIZE_QUEUE = "compactor.summarize"
MAINTENANCE_QUEUE = "compactor.maintenance"
QUEUES = (EVALUATE_QUEUE, SUMMARIZE_QUEUE, MAINTENANCE_QUEUE)

EVALUATE_TASK = "compactor.evaluate"
SUMMARIZE_TASK = "compactor.summarize"
PRUNE_TASK = "compactor.prune"
RECONCILE_TASK = "compactor.reconcile"

DEFAULT_BROKER = DEFAULT_REDIS_URL


def broker_url(settings: Settings) -> str:
    """``[broker] url``, else the state's Redis (``[redis] url``), which then holds both."""
    if settings.broker.url is not None:
        return settings.broker.url.get_secret_value()
    state = redis_url(settings) or DEFAULT_BROKER
    if is_shared_state_only(state):
        raise ConfigError(
            "broker.url",
            "required when redis.url is a Redis Cluster or Sentinel URL: the task queues need "
            "a standalone Redis (or another broker) of their own",
        )
    return state


def broker_ssl(url: str) -> dict[str, Any] | None:
    """TLS: certificate checks on by default; ``?ssl_cert_reqs=...`` in the URL may relax
    them."""
    return {"ssl_cert_reqs": ssl.CERT_REQUIRED} if url.startswith("rediss://") else None


def task_message(task: str, args: list[Any]) -> tuple[list[Any], dict[str, Any], str]:
    """A Celery protocol-2 task message: (body, headers, task id)."""
    task_id = str(uuid.uuid4())
    headers = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(args),
        "kwargsrepr": "{}",
        "origin": f"{os.getpid()}@{socket.gethostname()}",
        "ignore_result": True,
    }
    body = [args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    return body, headers, task_id


class TaskSender:
    """Sends task messages to the broker over one kombu connection (thread-safe: a send holds
    a lock for the few hundred microseconds it takes). Connection errors become
    :class:`RedisUnavailable`, after kombu's own reconnect attempts."""

    def __init__(self, url: str, *, max_retries: int = 3) -> None:
        import kombu

        self._kombu: Any = kombu  # kombu's annotations are partial
        self._connection: Any = self._kombu.Connection(url, ssl=broker_ssl(url) or False)
        self._max_retries = max_retries
        self._lock = threading.Lock()
        self._producer: Any = None
        self._queues: dict[str, Any] = {}

    def send(self, task: str, args: list[Any], *, queue: str) -> str:
        """Publish the task on ``queue`` (declared if needed); returns the task id."""
        body, headers, task_id = task_message(task, args)
        declared = self._queue(queue)
        with self._lock:
            try:
                if self._producer is None:
                    self._producer = self._connection.Producer(serializer="json")
                publish = self._connection.ensure(
                    self._producer, self._producer.publish, max_retries=self._max_retries
                )
                publish(
                    body,
                    exchange=declared.exchange,
                    routing_key=queue,
                    declare=[declared],
                    headers=headers,
                    correlation_id=task_id,
                    delivery_mode=2,
                )
            except self._connection.recoverable_connection_errors as exc:
                self._producer = None
                raise RedisUnavailable(
                    f"broker unavailable while sending a task: {type(exc).__name__}"
                ) from None
        return task_id

    def _queue(self, name: str) -> Any:
        queue = self._queues.get(name)
        if queue is None:
            exchange = self._kombu.Exchange(name, type="direct")
            queue = self._queues[name] = self._kombu.Queue(name, exchange, routing_key=name)
        return queue

    def close(self) -> None:
        with self._lock:
            self._producer = None
            self._connection.release()
