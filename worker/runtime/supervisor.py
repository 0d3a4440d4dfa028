"""The processes of a service on one machine: an embedded Redis when none is configured, the
workers of each kind and the scheduler (and ``compactor serve`` when asked), supervised: one
that exits is started again with a backoff. What ``compactor up`` and
:func:`worker.local.local_stack` run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.backend.embedded import PRIVATE_UMASK
from worker.config import (
    Settings,
    redis_url,
)


@dataclass(frozen=True)
class WorkerKind:
    """One of the workers ``compactor up`` runs: node ``NAME@host`` consuming ``queues``."""

    name: str
    queues: str
    pool: str
    concurrency: int


UP_WORKERS = (
    WorkerKind("evaluate", "compactor.evaluate,compactor.maintenance", "prefork", 2),
    WorkerKind("summarize", "compactor.summarize", "threads", 32),
)


def celery_command(
    role: str,
    settings_path: str | None,
    *,
    queues: str | None = None,
    pool: str | None = None,
    concurrency: int | None = None,
    name: str | None = None,
    workdir: Path | None = None,
    loglevel: str = "INFO",
) -> list[str]:
    cmd = [sys.executable, "-m", "celery", "-A", "worker", role, "--loglevel", loglevel]
    if role == "worker":
        cmd += ["-Q", queues or "compactor.evaluate,compactor.summarize,compactor.maintenance"]
        cmd += ["--pool", pool or "prefork"]
        if concurrency:
            cmd += ["--concurrency", str(concurrency)]
        cmd += ["-n", name or "compactor@%h", "--without-mingle", "--without-gossip"]
    else:
        schedule = (workdir or Path(tempfile.gettempdir())) / "compactor-beat-schedule"
        cmd += ["--schedule", str(schedule)]
    del settings_path
    return cmd


def child_env(settings_path: str | None, url: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if settings_path:
        env["COMPACTOR_CONFIG"] = str(Path(settings_path).resolve())
    if url:
        env["COMPACTOR_REDIS_URL"] = url
    return env


def log_json(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), file=sys.stderr, flush=True)


@dataclass
class _Child:
    role: str
    cmd: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_exits: int = 0  # exits in a row, each within ``stable_s`` of its start
    restart_at: float | None = None


class Supervisor:
    """Runs the children of ``compactor up`` and restarts any that exits, with a backoff.

    A child that exits is started again after ``backoff_s``, doubled for every further exit
    within ``stable_s`` of its start, up to ``max_backoff_s``; one that ran longer starts from
    ``backoff_s`` again. Each exit and restart is logged to stderr as a JSON line. Children get
    their own session, so a Ctrl-C reaches ``up`` alone, and :meth:`stop` stops them in order
    (SIGTERM: Celery's warm shutdown; SIGKILL after ``timeout_s``)."""

    def __init__(
        self,
        specs: list[tuple[str, list[str]]],
        *,
        env: dict[str, str],
        logs: Path,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        stable_s: float = 60.0,
        poll_s: float = 0.5,
    ) -> None:
        self.children = [_Child(role, cmd) for role, cmd in specs]
        self.env, self.logs = env, logs
        self.backoff_s, self.max_backoff_s, self.stable_s = backoff_s, max_backoff_s, stable_s
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            for child in self.children:
                self._spawn(child)
        self._thread = threading.Thread(target=self._watch, name="compactor-supervisor")
        self._thread.daemon = True
        self._thread.start()

    def pids(self) -> dict[str, int]:
        with self._lock:
            return {c.role: c.proc.pid for c in self.children if c.proc and c.proc.poll() is None}

    def _spawn(self, child: _Child) -> None:
        log = os.open(
            self.logs / f"{child.role}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        os.fchmod(log, 0o600)
        with os.fdopen(log, "ab") as out:  # the child keeps its own copy
            child.proc = subprocess.Popen(
                child.cmd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                umask=PRIVATE_UMASK,  # beat's schedule file, and whatever else they write
            )
        child.started_at = time.monotonic()
        child.restart_at = None
        log_json({"supervisor": "started", "role": child.role, "pid": child.proc.pid})

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s):
            with self._lock:
                if not self._stopping.is_set():
                    self.check()

    def check(self) -> None:
        """One round: note the children that exited, restart those whose backoff is over."""
        now = time.monotonic()
        for child in self.children:
            proc = child.proc
            if proc is not None and proc.poll() is not None:
                ran_s = now - child.started_at
                child.quick_exits = child.quick_exits + 1 if ran_s < self.stable_s else 1
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (child.quick_exits - 1))
                child.proc, child.restart_at = None, now + delay
                log_json(
                    {
                        "supervisor": "exited",
                        "role": child.role,
                        "pid": proc.pid,
                        "returncode": proc.returncode,
                        "ran_s": round(ran_s, 1),
                        "restart_in_s": delay,
                    }
                )
            elif child.proc is None and child.restart_at is not None and now >= child.restart_at:
                try:
                    self._spawn(child)
                except OSError as exc:  # e.g. out of processes: try again after the backoff
                    child.quick_exits += 1
                    child.restart_at = now + min(
                        self.max_backoff_s, self.backoff_s * 2 ** (child.quick_exits - 1)
                    )
                    log_json({"supervisor": "start failed", "role": child.role, "error": str(exc)})

    def stop(self, timeout_s: float = 20.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            running = [c.proc for c in self.children if c.proc is not None]
            for proc in running:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in running:
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextmanager
def running_services(
    settings: Settings,
    config: str | None,
    *,
    workdir: Path,
    summarize_concurrency: int = 32,
    redis_port: int | None = None,
    http_port: int | None = None,
    http_no_auth: bool = False,
) -> Iterator[str]:
    """Redis (embedded when no URL is configured), an evaluate worker, a summarize worker and
    the scheduler (and ``compactor serve`` on ``http_port``: the caller checks first that it
    has API keys, or ``http_no_auth``), until the block ends; a worker or the scheduler that
    exits is restarted (:class:`Supervisor`). Yields the Redis URL. Whatever was started is
    stopped again also when starting the rest fails or is interrupted."""
    from worker.backend.embedded import EmbeddedRedis

    with contextlib.ExitStack() as started:
        url = redis_url(settings)
        workdir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: Redis, logs, schedule
        if url is None:
            embedded = EmbeddedRedis(directory=workdir / "redis", appendonly=True, port=redis_port)
            (workdir / "redis").mkdir(mode=0o700, exist_ok=True)
            started.callback(embedded.stop)
            url = embedded.start()
        logs = workdir / "logs"
        logs.mkdir(mode=0o700, exist_ok=True)
        logs.chmod(0o700)  # also when an earlier run made it
        specs = [
            (
                kind.name,
                celery_command(
                    "worker",
                    config,
                    queues=kind.queues,
                    pool=kind.pool,
                    concurrency=(
                        summarize_concurrency if kind.name == "summarize" else kind.concurrency
                    ),
                    name=f"{kind.name}@%h",
                ),
            )
            for kind in UP_WORKERS
        ]
        specs.append(("beat", celery_command("beat", config, workdir=workdir)))
        if http_port is not None:  # compactor serve, supervised like the workers
            serve = [sys.executable, "-m", "worker", "serve", "--port", str(http_port)]
            specs.append(("http", serve + (["--no-auth"] if http_no_auth else [])))
        supervisor = Supervisor(specs, env=child_env(config, url), logs=logs)
        started.callback(supervisor.stop)  # runs first: the children, then Redis
        supervisor.start()
        yield url
