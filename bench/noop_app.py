"""A Celery app with one no-op task, configured exactly like ours: the throughput floor that
the scaling benchmark measures evaluation against (same Redis, same settings, same pool)."""

from __future__ import annotations

from celery import Celery

from worker.config import load_settings
from worker.runtime.celery_app import PromptEventLoop, celery_config

app = Celery("noop", set_as_current=False)
app.conf.update(celery_config(load_settings()))
app.conf.task_routes = {"bench.noop": {"queue": "bench.noop"}}
app.steps["worker"].add(PromptEventLoop)


@app.task(name="bench.noop")
def noop(conversation_id: str, submitted_at: float) -> None:
    del conversation_id, submitted_at
