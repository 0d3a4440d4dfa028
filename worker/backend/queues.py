"""Queue and task names, and sending a task message, without Celery.

The workers are Celery workers; what they consume are Celery task messages (protocol 2) on
plain queues. An agent process only ever sends two kinds, "evaluate this conversation" and
"compact this conversation now" (a compaction on demand), so the client builds them itself
with kombu (the messaging library Celery is built on) and never imports Celery.
docs/redis-protocol.md describes the message for other languages.

The broker is Redis (the state's, unless ``[broker] url`` names another) or RabbitMQ
(``amqp://``, through kombu's py-amqp transport); the state is always in Redis
(``worker.backend.connection.state_url``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from worker.backend.redis_target import DEFAULT_REDIS_URL, is_shared_state_only
from worker.config import Settings, configured_broker_url, redis_url
from worker.errors import BrokerUnavailable, ConfigError
from worker.ops.tracing import TRACE_HEADERS

__all__ = [
    "COMPACT_TASK",
    "EVALUATE_QUEUE",
    "EVALUATE_TASK",
    "MAINTENANCE_QUEUE",
    "QUEUES",
    "SUMMARIZE_QUEUE",
    "SUMMARIZE_TASK",
    "BrokerKind",
    "TaskSender",
    "broker_kind",
    "broker_url",
    "queue_lengths",
    "task_message",
]

EVALUATE_QUEUE = "compactor.evaluate"
SUMMARIZE_QUEUE = "compactor.summarize"
MAINTENANCE_QUEUE = "compactor.maintenance"
QUEUES = (EVALUATE_QUEUE, SUMMARIZE_QUEUE, MAINTENANCE_QUEUE)

EVALUATE_TASK = "compactor.evaluate"
SUMMARIZE_TASK = "compactor.summarize"
# A compaction someone asked for (args: [conversation id]); on the summarize queue, where the
# workers that may call an LLM listen.
COMPACT_TASK = "compactor.compact"
PRUNE_TASK = "compactor.prune"
RECONCILE_TASK = "compactor.reconcile"
IDLE_SCAN_TASK = "compactor.idle_scan"  # finds idle conversations (maintenance queue)
IDLE_COMPACT_TASK = "compactor.idle_compact"  # compacts one of them (summarize queue)

DEFAULT_BROKER = DEFAULT_REDIS_URL

BrokerKind = Literal["redis", "rabbitmq"]


def broker_url(settings: Settings) -> str:
    """Where task messages travel: ``[broker] url``, else the state's Redis, which then holds
    both (not possible for a Redis Cluster or Sentinel state: kombu speaks neither)."""
    configured = configured_broker_url(settings)
    if configured is not None:
        return configured
    state = redis_url(settings) or DEFAULT_BROKER
    if is_shared_state_only(state):
        raise ConfigError(
            "broker.url",
            "required when redis.url is a Redis Cluster or Sentinel URL: the task queues need "
            "a standalone Redis or RabbitMQ of their own",
        )
    return state


def broker_kind(url: str) -> BrokerKind:
    return "rabbitmq" if url.lower().startswith(("amqp://", "amqps://")) else "redis"


def broker_ssl(url: str) -> dict[str, Any] | None:
    """TLS, with certificate checks on. Redis: ``?ssl_cert_reqs=...`` in the URL may relax
    them. RabbitMQ: the system's CA certificates and the host name are checked (py-amqp's
    ``context`` form: :func:`ssl.create_default_context`)."""
    lowered = url.lower()
    if lowered.startswith("rediss://"):
        return {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if lowered.startswith("amqps://"):
        host = url.partition("://")[2].rpartition("@")[2].split("/")[0].rsplit(":", 1)[0]
        return {"context": {"check_hostname": True}, "server_hostname": host.strip("[]")}
    return None


def broker_transport_options(url: str) -> dict[str, Any]:
    """RabbitMQ: publisher confirms, so a send returns only once the broker has taken the
    message (Redis' LPUSH is answered the same way), as ``submit``'s promise needs."""
    return {"confirm_publish": True} if broker_kind(url) == "rabbitmq" else {}


def broker_errors(connection: Any) -> tuple[type[BaseException], ...]:
    """What a kombu connection raises when the broker cannot be used: its connection errors,
    MessageNacked (RabbitMQ refused a confirmed publish; "recoverable"), py-amqp's
    AccessRefused (a refused login or vhost: a channel error to kombu) and kombu's
    OperationalError (what ``ensure`` raises once its reconnect attempts are spent, the
    transport's error as its cause)."""
    from amqp.exceptions import AccessRefused  # py-amqp: kombu's own dependency
    from kombu.exceptions import OperationalError

    return (
        *connection.connection_errors,
        *connection.recoverable_connection_errors,
        AccessRefused,
        OperationalError,
    )


def broker_connection(url: str) -> Any:
    """A kombu connection to the broker (not yet connected), TLS and options as above."""
    import kombu

    connection: Any = kombu  # kombu's annotations are partial
    return connection.Connection(
        url, ssl=broker_ssl(url) or False, transport_options=broker_transport_options(url)
    )


def converted_broker_error(exc: BaseException, action: str) -> Exception:
    """A broker's connection error in the error tree: refused credentials are the
    configuration's fault (``broker.url``: the state's Redis refuses them before the broker is
    asked, when both are one); anything else may pass. Kombu's OperationalError is judged by
    the transport's error it wraps."""
    from kombu.exceptions import OperationalError

    cause = exc.__cause__ if isinstance(exc, OperationalError) else None
    judged = cause or exc
    refused = type(judged).__name__ in ("AccessRefused", "NotAllowed", "AuthenticationError")
    if refused and not _limit_reached(judged):
        return ConfigError("broker.url", "the broker refused the credentials (user or vhost)")
    return BrokerUnavailable(f"the broker cannot be reached while {action}: {_describe(judged)}")


def _limit_reached(exc: BaseException) -> bool:
    """RabbitMQ refuses a connection over a vhost's or user's connection limit with the same
    NOT_ALLOWED as an unknown vhost; only its text tells (a limit may free up: transient)."""
    return "limit" in str(getattr(exc, "reply_text", ""))


def _describe(exc: BaseException) -> str:
    """The error's kind and its reason: the socket's, or RabbitMQ's reply (never the URL: it
    may hold the password)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__} ({exc.strerror})"
    reply = getattr(exc, "reply_text", "")
    return f"{type(exc).__name__} ({reply})" if reply else type(exc).__name__


def queue_lengths(url: str, queues: Iterable[str] = QUEUES) -> dict[str, int]:
    """The messages waiting on each queue, as the broker counts them (a passive declare: a
    queue nobody declared yet holds nothing). Any broker kombu speaks; a channel per queue,
    since RabbitMQ closes the channel on which a passive declare found no queue."""
    connection = broker_connection(url)
    try:
        lengths = {}
        for name in queues:
            channel = connection.channel()
            try:
                lengths[name] = int(channel.queue_declare(queue=name, passive=True).message_count)
            except connection.channel_errors:
                lengths[name] = 0
            finally:
                with contextlib.suppress(*connection.channel_errors):
                    channel.close()
        return lengths
    except broker_errors(connection) as exc:
        raise converted_broker_error(exc, "reading queue lengths") from None
    finally:
        connection.release()


def task_message(
    task: str, args: list[Any], *, trace: Mapping[str, str] | None = None
) -> tuple[list[Any], dict[str, Any], str]:
    """A Celery protocol-2 task message: (body, headers, task id). ``trace``: the sender's W3C
    trace context (``traceparent``, ``tracestate``), carried as headers of their own, which a
    Celery worker hands the task in its request."""
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
    headers.update({k: v for k, v in (trace or {}).items() if k in TRACE_HEADERS})
    body = [args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    return body, headers, task_id


class TaskSender:
    """Sends task messages to the broker over one kombu connection (thread-safe: a send holds
    a lock for the few hundred microseconds it takes). Connection errors become
    :class:`BrokerUnavailable`, after kombu's own reconnect attempts."""

    def __init__(self, url: str, *, max_retries: int = 3) -> None:
        import kombu

        self._kombu: Any = kombu  # kombu's annotations are partial
        self._connection: Any = broker_connection(url)
        self._errors = broker_errors(self._connection)
        self._max_retries = max_retries
        self._lock = threading.Lock()
        self._producer: Any = None
        self._queues: dict[str, Any] = {}

    def send(
        self,
        task: str,
        args: list[Any],
        *,
        queue: str,
        trace: Mapping[str, str] | None = None,
    ) -> str:
        """Publish the task on ``queue`` (declared if needed); returns the task id. ``trace``:
        as :func:`task_message`."""
        body, headers, task_id = task_message(task, args, trace=trace)
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
            except self._errors as exc:
                self._producer = None
                raise converted_broker_error(exc, "sending a task") from None
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
