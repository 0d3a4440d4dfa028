"""The Celery app (``celery -A worker worker``): JSON only, late acks, bounded prefetch.

Queues: ``compactor.evaluate`` (fast: parse, project, count, decide), ``compactor.summarize``
(slow: LLM calls; run it on a threads pool so one process keeps many calls in flight) and
``compactor.maintenance`` (prune, reconcile). Evaluations never wait behind summaries.

Reliability settings, and why:
- ``task_acks_late`` + ``task_reject_on_worker_lost``: a task is acknowledged after it ran; if
  the worker dies mid-task the message is redelivered (every effect is idempotent).
- Redis as the broker: ``visibility_timeout`` (``[redis] visibility_timeout_s``) outlasts the
  longest compaction (``[worker] summarize_time_limit_s``), or a slow task would be delivered
  twice while running; a dead worker's task waits that long to be redelivered.
- RabbitMQ as the broker (``[broker] url = "amqp://..."``): an unacknowledged delivery goes
  back to its queue as soon as the consumer's channel closes, so a SIGKILLed worker's task is
  redelivered at once; the server's ``consumer_timeout`` (``[broker] consumer_timeout_s``)
  must outlast the longest task. Classic durable queues, persistent messages, publisher
  confirms (``rabbitmq_transport`` says why not quorum queues).
- ``task_publish_retry_policy`` (:data:`PUBLISH_RETRY_POLICY`): a task message a worker sends
  (a hand-off, a retry) is tried for about 12 s before it fails, so a broker restart does not
  drop it; past that the conversation waits in ``cw:pending`` for the reconciler.
- ``worker_prefetch_multiplier = 1``: a worker holds at most one extra message per slot, so a
  crash strands little and a slow worker does not hoard work. On RabbitMQ it also means the
  next message comes only after the last one's acknowledgement; that was slow only because of
  a kombu event-loop bug (:class:`PromptEventLoop`), not a reason for a higher prefetch (4
  made the stall rarer, not gone, and would queue evaluations behind a long one).
- ``accept_content = ["json"]``: pickle (and every other serializer) is refused.
- ``broker_transport`` (Redis only): kombu's Redis transport with a workaround
  (:mod:`worker.backend.broker`) for a kombu bug that made a busy worker exit when Redis restarted.
- :class:`PromptEventLoop` (a worker bootstep): a workaround for kombu's event loop, which
  could sleep up to 2 s with an acknowledgement waiting to be sent (see there); on RabbitMQ,
  with late acks and a small prefetch, that stalled a worker until its next timer.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

from celery import Celery, bootsteps
from celery.signals import setup_logging, worker_init

from worker.backend.broker import TRANSPORT as BROKER_TRANSPORT
from worker.backend.queues import (
    COMPACT_TASK,
    EVALUATE_QUEUE,
    EVALUATE_TASK,
    IDLE_COMPACT_TASK,
    IDLE_SCAN_TASK,
    MAINTENANCE_QUEUE,
    PRUNE_TASK,
    QUEUES,
    RECONCILE_TASK,
    SUMMARIZE_QUEUE,
    SUMMARIZE_TASK,
    broker_kind,
    broker_ssl,
    broker_transport_options,
    broker_url,
)
from worker.config import Settings, load_settings
from worker.errors import ConfigError

__all__ = [
    "EVALUATE_QUEUE",
    "MAINTENANCE_QUEUE",
    "QUEUES",
    "SUMMARIZE_QUEUE",
    "PromptEventLoop",
    "app",
    "broker_url",
    "make_app",
]


# How a worker's own task messages (a summary handed on, an evaluation after a lost lease or a
# release, a retry) ride out a broker that blinks: about 12 s of attempts, longer than the
# state's Redis client rides out a restart (about 5 s). Celery's default (three
# attempts in 0.6 s) gave up while a restarted Redis was still loading: the evaluation whose
# hand-off failed was acknowledged as failed, a retry whose message could not be sent was
# rejected for good, and the conversation waited for the reconciler.
PUBLISH_RETRY_POLICY = {
    "max_retries": 8,
    "interval_start": 0.2,
    "interval_step": 0.4,
    "interval_max": 2.0,
}

# The longest a delivery stays unacknowledged beyond its time limit: a summary rescheduled for
# when a lease lapses (``redis.lock_lease_s``) or a retry's backoff (30 s at most) is held by
# the worker, unacknowledged, until it is due.
HELD_BEYOND_LIMIT_S = 60


def redis_transport(settings: Settings) -> dict[str, Any]:
    """Redis as the broker: the transport with a workaround, and when it redelivers."""
    if settings.redis.visibility_timeout_s <= settings.worker.summarize_time_limit_s:
        raise ConfigError(
            "redis.visibility_timeout_s",
            "must be longer than worker.summarize_time_limit_s, or running "
            "compactions are delivered twice",
        )
    options = {
        "visibility_timeout": settings.redis.visibility_timeout_s,
        # Sweep for messages of dead workers every 10 s (kombu's default is every 100 s);
        # only messages unacknowledged for longer than the visibility timeout are restored.
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 1,
    }
    return {"broker_transport": BROKER_TRANSPORT, "broker_transport_options": options}


def rabbitmq_transport(settings: Settings, url: str) -> dict[str, Any]:
    """RabbitMQ as the broker: kombu's py-amqp transport (chosen by the URL's scheme).

    Redelivery: a delivery not yet acknowledged (``task_acks_late``) is requeued by the server
    when the channel it went out on closes: a worker that dies loses its connection, so its
    tasks are back on their queue within moments, not after a visibility timeout. The server
    also closes a channel whose delivery stayed unacknowledged past its ``consumer_timeout``,
    which would run a long task twice: the longest task must fit.

    Classic queues: the queues are declared as Celery and the client always declared them
    (durable, no ``x-queue-type``), i.e. RabbitMQ's classic queues, with global QoS. Quorum
    queues replicate a queue over a RabbitMQ cluster, but they refuse global QoS, and Celery
    then runs countdowns (a summary rescheduled for when a lease lapses, retry backoffs)
    through its "native delayed delivery" exchanges instead of holding the message. Losing a
    queued message costs little here: the conversation's state is in Redis and the reconciler
    re-queues whatever waits without a message.
    """
    longest = max(settings.worker.summarize_time_limit_s, settings.worker.evaluate_time_limit_s)
    if settings.broker.consumer_timeout_s <= longest + HELD_BEYOND_LIMIT_S:
        raise ConfigError(
            "broker.consumer_timeout_s",
            f"must be longer than worker.summarize_time_limit_s + {HELD_BEYOND_LIMIT_S} s, or "
            "RabbitMQ closes the channel of a running compaction and it runs twice (raise the "
            "server's consumer_timeout as well)",
        )
    return {"broker_transport_options": broker_transport_options(url)}


def celery_config(settings: Settings) -> dict[str, Any]:
    url = broker_url(settings)
    transport = (
        rabbitmq_transport(settings, url)
        if broker_kind(url) == "rabbitmq"
        else redis_transport(settings)
    )
    config: dict[str, Any] = {
        "broker_url": url,
        **transport,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "task_publish_retry_policy": PUBLISH_RETRY_POLICY,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        "task_ignore_result": True,
        "result_backend": None,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_hijack_root_logger": False,
        "task_default_queue": EVALUATE_QUEUE,
        "task_create_missing_queues": True,
        "task_routes": {
            EVALUATE_TASK: {"queue": EVALUATE_QUEUE},
            SUMMARIZE_TASK: {"queue": SUMMARIZE_QUEUE},
            COMPACT_TASK: {"queue": SUMMARIZE_QUEUE},
            PRUNE_TASK: {"queue": MAINTENANCE_QUEUE},
            RECONCILE_TASK: {"queue": MAINTENANCE_QUEUE},
            IDLE_SCAN_TASK: {"queue": MAINTENANCE_QUEUE},
            IDLE_COMPACT_TASK: {"queue": SUMMARIZE_QUEUE},
        },
        "beat_schedule": _beat_schedule(settings),
        "worker_send_task_events": True,
        "task_send_sent_event": False,
    }
    tls = broker_ssl(url)
    if tls is not None:
        config["broker_use_ssl"] = tls
    return config


def _beat_schedule(settings: Settings) -> dict[str, Any]:
    """The scheduler's periodic tasks; the idle scan only when idle compaction is on."""
    w = settings.worker
    schedule: dict[str, Any] = {
        "prune-transcripts": {"task": PRUNE_TASK, "schedule": w.prune_interval_s},
        "reconcile-pending": {"task": RECONCILE_TASK, "schedule": w.reconcile_interval_s},
    }
    if settings.compaction.idle_compact_after_s is not None:
        schedule["idle-compaction"] = {"task": IDLE_SCAN_TASK, "schedule": w.idle_scan_interval_s}
    return schedule


def wake_when_ready(hub: Any) -> bool:
    """Make ``hub`` (a kombu event loop) poll without waiting while callbacks are ready.

    The bug (kombu 5.7.0, the newest release; celery/celery#7718 and celery/kombu#1587 are the
    same family): each turn of ``Hub.create_loop`` runs the callbacks that were ready at its
    start, fires timers, then polls the sockets for up to the next timer (about 2 s in a
    worker: its heartbeat). A callback queued with ``call_soon`` by the loop's own thread
    while that turn runs sets no wakeup (only other threads' calls do), so it waits for the
    poll. On py-amqp that is every turn: the transport's reader re-queues itself with
    ``call_soon`` after reading a message, the next read happens among the ready callbacks,
    and a task run there (``--pool solo``, or the prefork pool's bookkeeping) queues its
    acknowledgement the same way. With ``task_acks_late`` and a prefetch of 1 per slot,
    RabbitMQ sends the next message only after that acknowledgement, so nothing arrives to end
    the poll: the worker sat idle until its heartbeat timer, about 1 s per message on
    average, in bursts (measured: a solo worker draining no-op tasks at 37-130/s instead of
    more than 1,000/s; evidence in the README's "Brokers"). Redis' transport reads in the
    poll's own callbacks, so it was rarely hit.

    The workaround: a tick callback (``Hub.on_tick``, run just before every poll, kept when
    the hub is reset after a lost connection) that, while callbacks are ready, sets the hub's
    own wakeup, so the poll returns at once and the next turn runs them. It reads two private
    attributes of kombu's hub (``_ready``, ``_waker``); without them (another kombu) it
    installs nothing and returns False, and ``tests/unit/test_event_loop.py`` fails, so an upgrade
    cannot drop it silently. Remove it when kombu's loop polls with a zero timeout while
    callbacks are ready (that test's "kombu itself" case then fails)."""
    if not hasattr(hub, "_ready") or not hasattr(hub, "_waker"):
        return False

    def wake_if_ready() -> None:
        waker = hub._waker
        if hub._ready and waker is not None:
            waker.wake()

    hub.on_tick.add(wake_if_ready)
    return True


class PromptEventLoop(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    """The worker's event loop with :func:`wake_when_ready` applied (a worker bootstep, after
    Celery's ``Hub`` step; workers without an event loop have no hub and are left alone)."""

    requires = ("celery.worker.components:Hub",)

    def create(self, w: Any) -> None:
        if getattr(w, "hub", None) is not None:
            wake_when_ready(w.hub)


def make_app(settings: Settings | None = None) -> Celery:
    resolved = settings or load_settings(os.environ.get("COMPACTOR_CONFIG") or None)
    app = Celery("worker", set_as_current=False)
    app.conf.update(celery_config(resolved))
    app.steps["worker"].add(PromptEventLoop)
    app.conf.compactor_settings = resolved
    return app


@setup_logging.connect
def _logging(loglevel: str | int | None = None, **_: Any) -> None:
    """Our JSON logs instead of Celery's format (connecting this makes Celery leave logging
    to us)."""
    from worker.ops.logs import configure_logging

    configure_logging(loglevel or "INFO", fmt=app.conf.compactor_settings.worker.log_format)


# A worker keeps the last parse of many conversations (``[worker] conversation_cache_mb``): a
# few hundred thousand objects the garbage collector would walk in every full collection, and
# with the default thresholds (700, 10, 10) a process parsing 500-message snapshots runs one
# every few dozen evaluations. Collecting young objects every 50,000 allocations, and everything
# about every 10 million, cut the CPU of such an evaluation by a quarter to a third (BENCHMARKS);
# reference counting still frees everything that holds no cycle at once. Python 3.14's
# incremental collector reads these numbers differently (and was not measured): left alone there.
WORKER_GC_THRESHOLDS = (50_000, 20, 10)
TUNES_GC = sys.version_info < (3, 14)


@worker_init.connect
def _tune_gc(**_: Any) -> None:
    """In the worker's main process, before any pool process is forked (they inherit it)."""
    if TUNES_GC:
        gc.set_threshold(*WORKER_GC_THRESHOLDS)


app = make_app()
app.autodiscover_tasks(["worker.runtime"], related_name="tasks", force=True)
