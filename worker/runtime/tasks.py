"""Thin Celery tasks over :class:`worker.runtime.service.Service`: parse the arguments, call, map
errors to retries (Redis unavailable) or final outcomes (everything else is an event)."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import Task
from celery.signals import worker_process_shutdown

from worker.backend.connection import connect, state_url
from worker.backend.queues import COMPACT_TASK, EVALUATE_QUEUE, SUMMARIZE_QUEUE
from worker.backend.redis_state import RedisState
from worker.config import Settings
from worker.errors import RedisUnavailable
from worker.ops.telemetry import telemetry
from worker.ops.tracing import TRACE_HEADERS
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.runtime.celery_app import app
from worker.runtime.service import Service
from worker.transcripts import open_store

log = logging.getLogger(__name__)
_services: dict[int, Service] = {}
_lock = threading.Lock()


def service() -> Service:
    """One Service per process (created after fork: sockets and threads do not survive it).
    Celery's task functions cannot take it as an argument; this is the one place it is held."""
    pid = os.getpid()
    svc = _services.get(pid)
    if svc is None:
        with _lock:
            svc = _services.get(pid)
            if svc is None:
                svc = _services[pid] = _build(app.conf.compactor_settings)
    return svc


def _build(settings: Settings) -> Service:
    from worker.summarize.factory import llm_summarizer

    state = RedisState(connect(state_url(settings)), settings.redis)
    traces = telemetry(settings)
    adapters = Adapters(store=open_store(settings), llm=llm_summarizer(settings), telemetry=traces)
    reuse = Reuse(conversation_cache_bytes=int(settings.worker.conversation_cache_mb * 2**20))
    # The tasks a task queues carry its trace on (the current span's context, as headers).
    return Service(
        settings=settings,
        state=state,
        pipeline=Pipeline(settings, adapters, reuse),
        enqueue_summarize=lambda conv, rev, delay_s: summarize.apply_async(
            args=[conv, rev],
            queue=SUMMARIZE_QUEUE,
            countdown=delay_s or None,
            headers=traces.carrier(),
        ),
        enqueue_evaluate=lambda conv: evaluate.apply_async(
            args=[conv, time.time()], queue=EVALUATE_QUEUE, headers=traces.carrier()
        ),
        enqueue_compact=lambda conv, delay_s: compact.apply_async(
            args=[conv], queue=SUMMARIZE_QUEUE, countdown=delay_s or None
        ),
        enqueue_idle=lambda conv: idle_compact.apply_async(args=[conv], queue=SUMMARIZE_QUEUE),
    )


def trace_context(request: Any) -> dict[str, str]:
    """The W3C trace context a task message carried (Celery hands a message's own headers to
    the task as attributes of its request); ``{}``: none."""
    found = {name: getattr(request, name, None) for name in TRACE_HEADERS}
    return {name: value for name, value in found.items() if isinstance(value, str)}


@worker_process_shutdown.connect
def _close(**_: Any) -> None:
    svc = _services.pop(os.getpid(), None)
    if svc is None:
        return
    svc.pipeline.adapters.store.close()  # a database store's pooled connections
    llm = svc.pipeline.adapters.llm
    if llm is not None and hasattr(llm, "close"):
        llm.close()
    svc.telemetry.shutdown()  # sends the spans still batched


_RETRY: dict[str, Any] = {
    "autoretry_for": (RedisUnavailable,),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": app.conf.compactor_settings.worker.max_retries,
}
_LIMITS = app.conf.compactor_settings.worker


@app.task(
    name="compactor.evaluate",
    bind=True,
    time_limit=_LIMITS.evaluate_time_limit_s,
    soft_time_limit=_LIMITS.evaluate_time_limit_s * 0.8,
    **_RETRY,
)
def evaluate(self: Task, conversation_id: str, submitted_at: float | None = None) -> str:
    outcome = service().evaluate(
        conversation_id, submitted_at=submitted_at, trace=trace_context(self.request)
    )
    log.info("evaluated", extra={"conversation_id": conversation_id, "outcome": outcome})
    return outcome


@app.task(
    name="compactor.summarize",
    bind=True,
    time_limit=_LIMITS.summarize_time_limit_s,
    soft_time_limit=_LIMITS.summarize_time_limit_s * 0.9,
    **_RETRY,
)
def summarize(self: Task, conversation_id: str, revision: int) -> str:
    outcome = service().summarize(conversation_id, revision, trace=trace_context(self.request))
    log.info(
        "summarized",
        extra={"conversation_id": conversation_id, "revision": revision, "outcome": outcome},
    )
    return outcome


@app.task(
    name=COMPACT_TASK,
    bind=True,
    time_limit=_LIMITS.summarize_time_limit_s,
    soft_time_limit=_LIMITS.summarize_time_limit_s * 0.9,
    **_RETRY,
)
def compact(self: Task, conversation_id: str) -> str:
    """A compaction someone asked for (``Client.compact_now``, ``POST .../compact``)."""
    outcome = service().compact_requested(conversation_id)
    log.info("compacted on request", extra={"conversation_id": conversation_id, "outcome": outcome})
    return outcome


@app.task(name="compactor.prune", bind=True, **_RETRY)
def prune(self: Task) -> int:
    removed = service().prune()
    log.info("pruned", extra={"removed": len(removed)})
    return len(removed)


@app.task(name="compactor.reconcile", bind=True, **_RETRY)
def reconcile(self: Task) -> int:
    stale = service().reconcile()
    if stale:
        log.warning("re-queued stale conversations", extra={"count": len(stale)})
    return len(stale)


@app.task(name="compactor.idle_scan", bind=True, **_RETRY)
def idle_scan(self: Task) -> int:
    found = service().idle_scan()
    if found:
        log.info("idle conversations handed to compaction", extra={"count": len(found)})
    return len(found)


@app.task(
    name="compactor.idle_compact",
    bind=True,
    time_limit=_LIMITS.summarize_time_limit_s,
    soft_time_limit=_LIMITS.summarize_time_limit_s * 0.9,
    **_RETRY,
)
def idle_compact(self: Task, conversation_id: str) -> str:
    outcome = service().compact_idle(conversation_id)
    log.info("idle compaction", extra={"conversation_id": conversation_id, "outcome": outcome})
    return outcome
