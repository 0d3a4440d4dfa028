"""The ``compactor`` commands that talk to Redis and Celery: submit, events, worker, beat, up,
status, metrics. Kept apart from :mod:`worker.cli` so the offline commands never import Celery."""

from __future__ import annotations

import argparse
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

from worker.config import Settings, load_settings, mask_url, with_redis_url
from worker.embedded import PRIVATE_UMASK
from worker.events import OUTCOME_TYPES


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


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def cmd_submit(args: argparse.Namespace) -> int:
    from worker.cli import read_input
    from worker.client import Client

    settings = _settings(args)
    client = Client(settings)
    try:
        for path in args.snapshots:
            data = read_input(path, settings.compaction.max_snapshot_bytes)
            result = client.submit(data)
            print(
                json.dumps({"snapshot": path, "status": result.status, "revision": result.revision})
            )
    finally:
        client.close()
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    from worker.client import Client

    client = Client(_settings(args))
    try:
        for entry_id, event in client.events(
            args.conversation_id, after=args.after, follow=args.follow
        ):
            line = json.loads(event.to_json())
            line["stream_id"] = entry_id
            print(json.dumps(line, ensure_ascii=False), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0


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


def _child_env(settings_path: str | None, url: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if settings_path:
        env["COMPACTOR_CONFIG"] = str(Path(settings_path).resolve())
    if url:
        env["COMPACTOR_REDIS_URL"] = url
    return env


def cmd_worker(args: argparse.Namespace) -> int:
    _settings(args)  # fail early, with a clear message, on a bad configuration
    cmd = celery_command(
        "worker",
        args.config,
        queues=args.queues,
        pool=args.pool,
        concurrency=args.concurrency,
        name=args.name,
    )
    os.execve(sys.executable, cmd, _child_env(args.config, None))
    return 0  # pragma: no cover - exec does not return


def cmd_beat(args: argparse.Namespace) -> int:
    _settings(args)
    os.execve(sys.executable, celery_command("beat", args.config), _child_env(args.config, None))
    return 0  # pragma: no cover


def _log_json(doc: dict[str, Any]) -> None:
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
        _log_json({"supervisor": "started", "role": child.role, "pid": child.proc.pid})

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
                _log_json(
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
                    _log_json({"supervisor": "start failed", "role": child.role, "error": str(exc)})

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
) -> Iterator[str]:
    """Redis (embedded when no URL is configured), an evaluate worker, a summarize worker and
    the scheduler, until the block ends; a worker or the scheduler that exits is restarted
    (:class:`Supervisor`). Yields the Redis URL."""
    from worker.config import redis_url
    from worker.embedded import EmbeddedRedis

    embedded = None
    url = redis_url(settings)
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: Redis data, logs, schedule
    if url is None:
        embedded = EmbeddedRedis(directory=workdir / "redis", appendonly=True, port=redis_port)
        (workdir / "redis").mkdir(mode=0o700, exist_ok=True)
        url = embedded.start()
    env = _child_env(config, url)
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
                concurrency=summarize_concurrency if kind.name == "summarize" else kind.concurrency,
                name=f"{kind.name}@%h",
            ),
        )
        for kind in UP_WORKERS
    ]
    specs.append(("beat", celery_command("beat", config, workdir=workdir)))
    if http_port is not None:  # compactor serve, supervised like the workers
        specs.append(("http", [sys.executable, "-m", "worker", "serve", "--port", str(http_port)]))
    supervisor = Supervisor(specs, env=env, logs=logs)
    try:
        supervisor.start()
        yield url
    finally:
        supervisor.stop()
        if embedded is not None:
            embedded.stop()


@contextmanager
def broker_errors(action: str) -> Iterator[None]:
    """Kombu raises redis-py's errors wrapped in its OperationalError (a refused password too):
    converted here, where they enter, into the error tree the same way as every other Redis
    error (worker.redis_state.redis_errors); RabbitMQ's (py-amqp's) as the client's sender
    converts them (worker.queues.converted_broker_error)."""
    import redis
    from kombu.exceptions import OperationalError

    from worker.queues import converted_broker_error
    from worker.redis_state import redis_errors

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


def wait_for_workers(url: str, settings: Settings, expected: int, timeout_s: float) -> bool:
    from worker.celery_app import make_app

    app = make_app(with_redis_url(settings, url))
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            replies = ping(app, timeout_s=1.0)
            if len(replies) >= expected:
                return True
        return False
    finally:
        app.close()


def _interrupt(signum: int, frame: Any) -> None:
    # Once: a second SIGTERM or Ctrl-C must not cut the shutdown short and leave children
    # running (they get SIGKILL after their grace period anyway).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def cmd_up(args: argparse.Namespace) -> int:
    # SIGTERM (systemd, docker stop, kill) shuts down as cleanly as Ctrl-C: workers, then Redis.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    settings = _settings(args)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="compactor-up-"))
    with running_services(
        settings,
        args.config,
        workdir=workdir,
        redis_port=args.redis_port,
        http_port=args.http_port,
    ) as url:
        print(json.dumps({"redis": mask_url(url), "logs": str(workdir / "logs")}), flush=True)
        if not wait_for_workers(url, settings, expected=2, timeout_s=60):
            print(json.dumps({"error": "workers did not start; see the logs"}), file=sys.stderr)
            return 1
        print(json.dumps({"status": "workers ready"}), flush=True)
        if args.submit:
            code = _submit_and_follow(settings, url, args.submit, timeout_s=args.timeout)
            if args.until_done:
                return code
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    return 0


def _submit_and_follow(settings: Settings, url: str, paths: list[str], *, timeout_s: float) -> int:
    from worker.client import Client

    client = Client(with_redis_url(settings, url))
    try:
        pending: dict[str, str] = {}
        for path in paths:
            data = Path(path).read_bytes()
            conversation_id = json.loads(data)["conversation_id"]
            result = client.submit(data)
            print(
                json.dumps(
                    {"submitted": path, "conversation_id": conversation_id, "status": result.status}
                ),
                flush=True,
            )
            pending[conversation_id] = "0"
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for conversation_id in list(pending):
                for entry_id, event in client.events(
                    conversation_id, after=pending[conversation_id]
                ):
                    pending[conversation_id] = entry_id
                    _print_event(event)
                    if event.type in OUTCOME_TYPES:
                        pending.pop(conversation_id, None)
            time.sleep(0.2)
        if pending:
            print(
                json.dumps({"error": "no outcome in time", "conversations": sorted(pending)}),
                file=sys.stderr,
            )
            return 1
        return 0
    finally:
        client.close()


def _print_event(event: Any) -> None:
    doc = json.loads(event.to_json())
    c = doc.get("compaction")
    if c:  # the replacement is long; show its shape and the summary's head
        c["replacement"] = f"<{len(c['replacement'])} messages>"
        c["summary"]["text"] = c["summary"]["text"][:400] + "…"
    print(json.dumps(doc, ensure_ascii=False, indent=1), flush=True)


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


def cmd_status(args: argparse.Namespace) -> int:
    from worker.celery_app import QUEUES, make_app
    from worker.queues import broker_kind, broker_url, queue_lengths
    from worker.redis_state import RedisState, connect, state_url

    settings = _settings(args)
    state = RedisState(connect(state_url(settings)), settings.redis)
    app = make_app(settings)
    try:
        counters = state.counters()  # first: Redis' refusal of a password names redis.url
        queues = queue_lengths(broker_url(settings))
        active = active_queues(app, timeout_s=1.0)
        kinds = classify_workers(active)
        consumed = {
            q.get("name") for qs in active.values() for q in qs or [] if isinstance(q, dict)
        }
        missing = sorted(kind for kind, nodes in kinds.items() if not nodes)
        doc = {
            "redis": mask_url(state_url(settings)),
            "broker": mask_url(broker_url(settings)),
            "broker_kind": broker_kind(broker_url(settings)),
            "queues": queues,
            "workers": sorted(active),
            "kinds": kinds,
            "missing_kinds": missing,
            "queues_without_consumer": [q for q in QUEUES if q not in consumed],
            "counters": counters,
            "recent_events": [
                {k: e.get(k) for k in ("type", "conversation_id", "revision", "created_at")}
                for e in state.recent_events(args.recent)
            ],
        }
        print(json.dumps(doc, indent=2))
        if missing:
            print(
                json.dumps({"error": "no worker answers for: " + ", ".join(missing)}),
                file=sys.stderr,
            )
            return 1
        return 0
    finally:
        app.close()
        state.client.close()


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from worker.api.server import serve
    except ImportError as exc:  # the optional extra is not installed
        from worker.errors import UsageError

        raise UsageError(
            f"compactor serve needs the http extra (pip install 'compaction-worker[http]'): {exc}"
        ) from None
    return serve(_settings(args), host=args.host, port=args.port)


def cmd_metrics(args: argparse.Namespace) -> int:
    from worker.metrics import render_prometheus, serve
    from worker.queues import broker_url, queue_lengths
    from worker.redis_state import RedisState, connect, state_url

    settings = _settings(args)
    state = RedisState(connect(state_url(settings)), settings.redis)

    def render() -> str:
        return render_prometheus(state.counters(), queue_lengths(broker_url(settings)))

    if args.serve is None:
        sys.stdout.write(render())
        return 0
    serve(render, port=args.serve, host=args.host)
    return 0


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("submit", parents=[common], help="enqueue snapshots and return at once")
    p.add_argument("snapshots", nargs="+", help="snapshot JSON files (- for stdin)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("events", parents=[common], help="a conversation's events as JSON lines")
    p.add_argument("conversation_id")
    p.add_argument("--after", default="0", help="resume after this stream id")
    p.add_argument("--follow", action="store_true", help="wait for new events")
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("worker", parents=[common], help="run a worker (celery -A worker worker)")
    p.add_argument("--queues", help="comma-separated (default: all three)")
    p.add_argument("--pool", choices=["prefork", "threads", "solo"])
    p.add_argument("--concurrency", type=int)
    p.add_argument("--name", help="node name (default compactor@%%h)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("beat", parents=[common], help="run the scheduler (prune, reconcile)")
    p.set_defaults(func=cmd_beat)

    p = sub.add_parser(
        "up",
        parents=[common],
        help="Redis (embedded if none configured), workers and the scheduler on this machine",
    )
    p.add_argument("--submit", nargs="*", help="snapshot files to submit once ready")
    p.add_argument(
        "--until-done",
        action="store_true",
        help="exit when every submitted snapshot has its outcome",
    )
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--workdir", help="where the embedded Redis and the logs live")
    p.add_argument(
        "--redis-port",
        type=int,
        help="the embedded Redis' loopback port (default: a free one; printed at start)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        help="also run `compactor serve` on this port (bound to [http] host), supervised",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser(
        "status",
        parents=[common],
        help="queues, workers (per kind), counters, events; exit 1 when a worker kind is missing",
    )
    p.add_argument("--recent", type=int, default=10)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("serve", parents=[common], help="the HTTP API and the proxy (uvicorn)")
    p.add_argument("--host", help="address to bind (default [http] host: 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default [http] port: 8080; 0: a free one)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("metrics", parents=[common], help="Prometheus metrics (print or serve)")
    p.add_argument("--serve", type=int, metavar="PORT", help="serve /metrics on HOST:PORT")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind with --serve (default 127.0.0.1; 0.0.0.0 in a container)",
    )
    p.set_defaults(func=cmd_metrics)
