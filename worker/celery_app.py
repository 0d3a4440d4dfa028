"""The Celery app (``celery -A worker worker``): JSON only, late acks, bounded prefetch.

Queues: ``compactor.evaluate`` (fast: parse, project, count, decide), ``compactor.summarize``
(slow: LLM calls; run it on a threads pool so one process keeps many calls in flight) and
``compactor.maintenance`` (prune, reconcile). Evaluations never wait behind summaries.

Reliability settings, and why:
- ``task_acks_late`` + ``task_reject_on_worker_lost``: a task is acknowledged after it ran; if
  the worker dies mid-task the message is redelivered (every effect is idempotent).
- ``visibility_timeout`` (``[redis] visibility_timeout_s``) outlasts the longest compaction
  (``[worker] summarize_time_limit_s``), or a slow task would be delivered twice while running.
- ``worker_prefetch_multiplier = 1``: a worker holds at most one extra message per slot, so a
  crash strands little and a slow worker does not hoard work.
- ``accept_content = ["json"]``: pickle (and every other serializer) is refused.
- ``broker_transport``: kombu's Redis transport with a workaround (:mod:`worker.broker`) for a
  kombu bug that made a busy worker exit when Redis restarted.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

from celery import Celery
from celery.signals import setup_logging, worker_init

from worker.broker import TRANSPORT as BROKER_TRANSPORT
from worker.config import Settings, load_settings
from worker.errors import ConfigError
from worker.queues import (
    EVALUATE_QUEUE,
    EVALUATE_TASK,
    MAINTENANCE_QUEUE,
    PRUNE_TASK,
    QUEUES,
    RECONCILE_TASK,
    SUMMARIZE_QUEUE,
    SUMMARIZE_TASK,
    broker_ssl,
    broker_url,
)

__all__ = [
    "EVALUATE_QUEUE",
    "MAINTENANCE_QUEUE",
    "QUEUES",
    "SUMMARIZE_QUEUE",
    "app",
    "broker_url",
    "make_app",
]


def celery_config(settings: Settings) -> dict[str, Any]:
    w = settings.worker
    if settings.redis.visibility_timeout_s <= w.summarize_time_limit_s:
        raise ConfigError(
            "redis.visibility_timeout_s",
            "must be longer than worker.summarize_time_limit_s, or running "
            "compactions are delivered twice",
        )
    url = broker_url(settings)
    transport: dict[str, Any] = {
        "visibility_timeout": settings.redis.visibility_timeout_s,
        # Sweep for messages of dead workers every 10 s (kombu's default is every 100 s);
        # only messages unacknowledged for longer than the visibility timeout are restored.
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 1,
    }
    config: dict[str, Any] = {
        "broker_url": url,
        "broker_transport": BROKER_TRANSPORT,  # kombu's redis transport, with one workaround
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
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
            PRUNE_TASK: {"queue": MAINTENANCE_QUEUE},
            RECONCILE_TASK: {"queue": MAINTENANCE_QUEUE},
        },
        "beat_schedule": {
            "prune-transcripts": {"task": PRUNE_TASK, "schedule": w.prune_interval_s},
            "reconcile-pending": {"task": RECONCILE_TASK, "schedule": w.reconcile_interval_s},
        },
        "worker_send_task_events": True,
        "task_send_sent_event": False,
    }
    tls = broker_ssl(url)
    if tls is not None:
        config["broker_use_ssl"] = tls
    return config


def make_app(settings: Settings | None = None) -> Celery:
    resolved = settings or load_settings(os.environ.get("COMPACTOR_CONFIG") or None)
    app = Celery("worker", set_as_current=False)
    app.conf.update(celery_config(resolved))
    app.conf.compactor_settings = resolved
    return app


@setup_logging.connect
def _logging(loglevel: str | int | None = None, **_: Any) -> None:
    """Our JSON logs instead of Celery's format (connecting this makes Celery leave logging
    to us)."""
    from worker.logs import configure_logging

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
app.autodiscover_tasks(["worker"], related_name="tasks", force=True)
