"""compaction-worker: conversation compaction for LLM agents, off the agent's critical path.

``celery -A worker worker`` finds the Celery app as ``worker.app``; it is imported lazily so
that the CLI and the pure core never pay for importing Celery.
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("app", "celery"):
        from worker.runtime.celery_app import app

        return app
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
