"""The ``compactor`` commands that talk to Redis and Celery: submit, events, worker, beat, up,
status, metrics, serve. Kept apart from :mod:`worker.cli` so the offline commands never import
Celery.

Each says at start, in one JSON line on stderr, which Redis (and broker) it uses and where that
came from (:func:`redis_in_use`): always for the long-running ones (``serve``, ``worker``,
``beat``, ``up``, ``metrics --serve``), for the one-shot ones (``submit``, ``events``,
``status``, ``metrics``) with ``--verbose`` or when stderr is a terminal, so a script reading
their output sees it unchanged."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.config import (
    Settings,
    configured_broker_url,
    load_settings,
    mask_url,
    redis_url,
    with_redis_url,
)
from worker.embedded import PRIVATE_UMASK, port_in_use, port_taken
from worker.errors import UsageError
from worker.events import OUTCOME_TYPES
from worker.models import WireFormat


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
    settings = load_settings(args.config)
    if getattr(args, "no_auth", False):
        http = settings.http.model_copy(update={"allow_unauthenticated": True})
        settings = settings.model_copy(update={"http": http})
        settings = settings.with_origin("http.allow_unauthenticated", "--no-auth")
    return settings


def _origin(settings: Settings, key: str) -> str:
    origin = settings.origin_of(key)
    return "built-in default" if origin == "default" else origin


def redis_in_use(settings: Settings) -> dict[str, Any]:
    """Which Redis holds the state and where the task messages travel, passwords masked, and
    where each URL came from (``COMPACTOR_REDIS_URL``, the config file, the built-in default,
    the embedded Redis of ``up``)."""
    from worker.queues import broker_url
    from worker.redis_state import state_url

    doc: dict[str, Any] = {"redis": mask_url(state_url(settings))}
    doc["redis_from"] = _origin(settings, "redis.url")
    doc["broker"] = mask_url(broker_url(settings))
    if configured_broker_url(settings) is None:
        doc["broker_from"] = "redis (no [broker] url)"
    else:
        doc["broker_from"] = _origin(settings, "broker.url")
    return doc


def _say_start(command: str, settings: Settings, **more: Any) -> None:
    """The start line: the command, its Redis and broker (:func:`redis_in_use`), and ``more``."""
    _log_json({"command": command} | redis_in_use(settings) | more)


def _say_start_if_asked(command: str, settings: Settings, args: argparse.Namespace) -> None:
    """The start line of a one-shot command: with ``--verbose``, or on a terminal."""
    if args.verbose or sys.stderr.isatty():
        _say_start(command, settings)


def cmd_submit(args: argparse.Namespace) -> int:
    from worker.cli import read_input
    from worker.client import Client

    settings = _settings(args)
    _say_start_if_asked("submit", settings, args)
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

    settings = _settings(args)
    _say_start_if_asked("events", settings, args)
    client = Client(settings)
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
    settings = _settings(args)  # fail early, with a clear message, on a bad configuration
    _say_start("worker", settings)
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
    _say_start("beat", _settings(args))
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
    http_no_auth: bool = False,
) -> Iterator[str]:
    """Redis (embedded when no URL is configured), an evaluate worker, a summarize worker and
    the scheduler, until the block ends; a worker or the scheduler that exits is restarted
    (:class:`Supervisor`). Yields the Redis URL. Whatever was started is stopped again also
    when starting the rest fails or is interrupted."""
    from worker.api.auth import serving_keys
    from worker.embedded import EmbeddedRedis

    if http_port is not None and not http_no_auth:
        serving_keys(settings, os.environ)  # no keys: refused before anything starts
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
        supervisor = Supervisor(specs, env=_child_env(config, url), logs=logs)
        started.callback(supervisor.stop)  # runs first: the children, then Redis
        supervisor.start()
        yield url


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


def wait_for_workers(
    url: str,
    settings: Settings,
    expected: int,
    timeout_s: float,
    *,
    stop: Callable[[], bool] = lambda: False,
) -> bool:
    """Whether ``expected`` workers answer a ping within ``timeout_s`` (False at once when
    ``stop()`` says to give up)."""
    from worker.celery_app import make_app

    app = make_app(with_redis_url(settings, url))
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not stop():
            replies = ping(app, timeout_s=1.0)
            if len(replies) >= expected:
                return True
        return False
    finally:
        app.close()


class StopRequest:
    """SIGTERM (systemd, docker stop, kill) or Ctrl-C, noted for ``up``'s main thread to act on
    at its next step, where it shuts down in order: workers, then Redis. Raising
    KeyboardInterrupt from the handler instead would land wherever the main thread is: inside
    a library's ``__del__`` (where Python swallows it) or its ``except BaseException``, leaving
    ``up`` running or dying half cleaned up. A second signal changes nothing: the shutdown is
    not cut short (children get SIGKILL after their grace period anyway)."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self) -> bool:
        """Whether a stop was requested."""
        return self.requested

    def _note(self, signum: int, frame: Any) -> None:
        self.requested = True

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._note)
        signal.signal(signal.SIGINT, self._note)

    def sleep(self) -> None:
        """Until a stop is requested."""
        while not self.requested:
            time.sleep(0.2)


EXIT_INTERRUPTED = 130  # as worker.cli's


def cmd_up(args: argparse.Namespace) -> int:
    stop = StopRequest()
    stop.install()
    settings = _settings(args)
    embedded = redis_url(settings) is None
    # Everything that would make it fail is refused before anything starts.
    auth = {} if args.http_port is None else _auth_in_use(settings)
    if args.http_port and port_in_use(settings.http.host, args.http_port):
        raise port_taken(settings.http.host, args.http_port, what=f"--http-port {args.http_port}")
    if embedded and args.redis_port and port_in_use("127.0.0.1", args.redis_port):
        raise port_taken("127.0.0.1", args.redis_port, what=f"--redis-port {args.redis_port}")
    snapshots = [_snapshot_to_submit(path, settings) for path in args.submit or []]
    with (
        _workdir(args.workdir) as workdir,
        running_services(
            settings,
            args.config,
            workdir=workdir,
            redis_port=args.redis_port,
            http_port=args.http_port,
            http_no_auth=args.no_auth,
        ) as url,
    ):
        used = with_redis_url(settings, url, origin="embedded") if embedded else settings
        _say_start("up", used, **auth)
        where = {"redis": mask_url(url), "logs": str(workdir / "logs")}
        print(json.dumps(where | {"removed_at_exit": args.workdir is None}), flush=True)
        ready = wait_for_workers(url, settings, expected=2, timeout_s=60, stop=stop)
        if stop():
            return EXIT_INTERRUPTED
        if not ready:
            print(json.dumps({"error": "workers did not start; see the logs"}), file=sys.stderr)
            return 1
        print(json.dumps({"status": "workers ready"}), flush=True)
        if snapshots:
            code = _submit_and_follow(settings, url, snapshots, timeout_s=args.timeout, stop=stop)
            if args.until_done or stop():
                return code
        stop.sleep()
    return 0


def _snapshot_to_submit(path: str, settings: Settings) -> tuple[str, str, bytes]:
    """(path, conversation id, bytes) of a file for ``--submit``, read before anything starts:
    UsageError for a file that cannot be read, InvalidSnapshot without a conversation id."""
    from worker.cli import read_input
    from worker.errors import InvalidSnapshot

    data = read_input(path, settings.compaction.max_snapshot_bytes)
    try:
        conversation_id = json.loads(data)["conversation_id"]
    except (ValueError, KeyError, TypeError):
        raise InvalidSnapshot("conversation_id", f"{path}: no conversation_id") from None
    if not isinstance(conversation_id, str):
        raise InvalidSnapshot("conversation_id", f"{path}: not a string")
    return path, conversation_id, data


@contextmanager
def _workdir(given: str | None) -> Iterator[Path]:
    """``--workdir``, kept; else a temporary directory, removed when ``up`` ends however it
    ends (after its children and Redis stopped: see :func:`running_services`)."""
    if given:
        yield Path(given)
        return
    made = Path(tempfile.mkdtemp(prefix="compactor-up-"))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def _submit_and_follow(
    settings: Settings,
    url: str,
    snapshots: list[tuple[str, str, bytes]],
    *,
    timeout_s: float,
    stop: StopRequest,
) -> int:
    """Submit ``snapshots`` (path, conversation id, bytes), print each of their events readably
    (:func:`describe_event`) until each has its outcome, then a line per conversation
    (:func:`conversation_totals`)."""
    from worker.client import Client

    client = Client(with_redis_url(settings, url))
    seen: list[Any] = []
    try:
        pending: dict[str, str] = {}
        for path, conversation_id, data in snapshots:
            result = client.submit(data)
            print(
                json.dumps(
                    {"submitted": path, "conversation_id": conversation_id, "status": result.status}
                ),
                flush=True,
            )
            pending[conversation_id] = "0"
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline and not stop():
            for conversation_id in list(pending):
                for entry_id, event in client.events(
                    conversation_id, after=pending[conversation_id]
                ):
                    pending[conversation_id] = entry_id
                    seen.append(event)
                    print("\n" + describe_event(event), flush=True)
                    if event.type in OUTCOME_TYPES:
                        pending.pop(conversation_id, None)
            time.sleep(0.2)
        print("\n" + "\n".join(conversation_totals(seen)), flush=True)
        if stop():
            return EXIT_INTERRUPTED
        if pending:
            print(
                json.dumps({"error": "no outcome in time", "conversations": sorted(pending)}),
                file=sys.stderr,
            )
            return 1
        return 0
    finally:
        client.close()


# --- what `up --submit` prints (make demo) ---------------------------------------------------


def describe_event(event: Any) -> str:
    """An event for a person: what happened, and for a compaction what the next request holds
    instead of the range it replaces, every message whole."""
    head = f"{event.conversation_id} revision {event.revision}: {event.type}"
    if event.type == "compaction.completed":
        return "\n".join([head, *_describe_compaction(event.compaction)])
    if event.type == "compaction.skipped":
        return f"{head}: {event.reason}"
    if event.type == "compaction.failed":
        return f"{head}: {event.reason} ({event.error.code})"
    if event.type == "compaction.rejected":
        where = f"{event.error.field}: " if event.error.field else ""
        return f"{head}: {where}{event.reason}"
    if event.type == "tool_results.elided":
        shortened = ", ".join(
            f"{e.call_id} ({e.tool}) {e.bytes_before:,} → {e.bytes_after:,} bytes"
            for e in event.elided
        )
        return f"{head}: the next request shortens {len(event.elided)} tool result(s): {shortened}"
    return head


def _describe_compaction(c: Any) -> list[str]:
    replaced = c.end - c.start
    lines = [
        f"  {c.tokens_before:,} → {c.tokens_after:,} tokens: messages {c.first_id} … {c.last_id} "
        f"({replaced}) are replaced; the next request holds instead these {len(c.replacement)}:"
    ]
    s = c.summary
    for role, text in _readable_messages(c.format, c.replacement):
        lines.append(f"  ┌ {role}" + (" (the summary)" if s.text and s.text in text else ""))
        lines += [f"  │ {line}" for line in text.splitlines() or [""]]
    facts = f", {s.fidelity.kept} of {s.fidelity.checked} facts kept" if s.fidelity else ""
    lines.append(f"  └ summary: {s.source}, {s.tokens:,} tokens{facts}")
    if c.transcript is not None:
        lines.append(f"    the replaced messages are kept in {c.transcript.uri}")
    return lines


def _readable_messages(fmt: WireFormat, wire: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of each message, as normalized for every format (tool calls as
    ``→ NAME ARGUMENTS``); the wire JSON for what does not normalize."""
    from worker.errors import CompactorError
    from worker.formats import to_messages

    try:
        messages = to_messages(fmt, wire)
    except CompactorError:
        return [(str(m.get("role", "?")), json.dumps(m, ensure_ascii=False)) for m in wire]
    out = []
    for m in messages:
        role = f"{m.role} ({m.tool_name})" if m.tool_name else str(m.role)
        parts = [m.content] if m.content else []
        parts += [f"→ {call.name} {call.arguments}" for call in m.tool_calls]
        parts += [f"[{a.kind}: {a.label}]" for a in m.attachments]
        out.append((role, "\n".join(parts)))
    return out


def conversation_totals(events: list[Any]) -> list[str]:
    """One line per conversation, in order of first event: its request's tokens before the
    first event and after the last (``c-1: 12,345 → 2,345 tokens (1 compaction)``)."""
    first: dict[str, int | None] = {}
    last: dict[str, int | None] = {}
    compactions: dict[str, int] = {}
    outcome: dict[str, Any] = {}
    for event in events:
        conv = event.conversation_id
        before, after = _token_counts(event)
        if first.get(conv) is None:
            first[conv] = before
        if after is not None:
            last[conv] = after
        compactions[conv] = compactions.get(conv, 0) + (event.type == "compaction.completed")
        if event.type in OUTCOME_TYPES:
            outcome[conv] = event
    lines = []
    for conv in first:
        n = compactions[conv]
        count = f"({n} compaction{'' if n == 1 else 's'})"
        before, after = first[conv], last.get(conv)
        if before is None or after is None:
            what = outcome.get(conv)
            said = f"{what.type}: {what.reason}" if what is not None else "no outcome"
            lines.append(f"{conv}: no token count {count}; {said}")
        else:
            lines.append(f"{conv}: {before:,} → {after:,} tokens {count}")
    return lines


def _token_counts(event: Any) -> tuple[int | None, int | None]:
    """The request's tokens before and after what ``event`` describes (None: not counted)."""
    if event.type == "compaction.completed":
        return event.compaction.tokens_before, event.compaction.tokens_after
    trigger = getattr(event, "trigger", None)
    tokens = trigger.projected_tokens if trigger is not None else None
    return tokens, tokens


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
    _say_start_if_asked("status", settings, args)
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
        raise UsageError(
            f"compactor serve needs the http extra (pip install 'compaction-worker[http]'): {exc}"
        ) from None
    settings = _settings(args)
    _say_start("serve", settings, **_auth_in_use(settings))
    return serve(settings, host=args.host, port=args.port)


def _auth_in_use(settings: Settings) -> dict[str, Any]:
    """How ``serve`` authenticates, for its start line: the number of API keys, or a warning
    that authentication is off. ConfigError when there are no keys and it is not explicitly
    off (:func:`worker.api.auth.serving_keys`)."""
    from worker.api.auth import OPEN_TENANT, serving_keys

    keys = serving_keys(settings, os.environ)
    if keys.open_to is None:
        return {"auth": "api_keys", "api_keys": len(keys)}
    how = _origin(settings, "http.allow_unauthenticated")
    return {
        "auth": "OFF",
        "warning": f"AUTHENTICATION IS OFF ({how}): every /v1 request, with or without a key, "
        f"acts as tenant {OPEN_TENANT!r}; anyone who can reach this port can read and write "
        "its conversations",
    }


def cmd_metrics(args: argparse.Namespace) -> int:
    from worker.metrics import render_prometheus, serve
    from worker.queues import broker_url, queue_lengths
    from worker.redis_state import RedisState, connect, state_url

    settings = _settings(args)
    if args.serve is None:
        _say_start_if_asked("metrics", settings, args)
    else:
        _say_start("metrics", settings)
    state = RedisState(connect(state_url(settings)), settings.redis)

    def render() -> str:
        return render_prometheus(state.counters(), queue_lengths(broker_url(settings)))

    if args.serve is None:
        sys.stdout.write(render())
        return 0
    serve(render, port=args.serve, host=args.host)
    return 0


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    one_shot = argparse.ArgumentParser(add_help=False, parents=[common])
    one_shot.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say on stderr which Redis and broker are used (always on a terminal)",
    )
    no_auth = argparse.ArgumentParser(add_help=False)
    no_auth.add_argument(
        "--no-auth",
        action="store_true",
        help="serve /v1 without API keys, every request as one tenant (loudly said at start); "
        "without keys and without this, serving is refused",
    )

    p = sub.add_parser("submit", parents=[one_shot], help="enqueue snapshots and return at once")
    p.add_argument("snapshots", nargs="+", help="snapshot JSON files (- for stdin)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("events", parents=[one_shot], help="a conversation's events as JSON lines")
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
        parents=[common, no_auth],
        help="Redis (embedded if none configured), workers and the scheduler on this machine",
    )
    p.add_argument("--submit", nargs="*", help="snapshot files to submit once ready")
    p.add_argument(
        "--until-done",
        action="store_true",
        help="exit when every submitted snapshot has its outcome",
    )
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument(
        "--workdir",
        help="where the embedded Redis and the logs live, kept after exit (default: a "
        "temporary directory, removed on exit)",
    )
    p.add_argument(
        "--redis-port",
        type=int,
        help="the embedded Redis' loopback port (default: a free one; printed at start); "
        "refused when something listens on it already",
    )
    p.add_argument(
        "--http-port",
        type=int,
        help="also run `compactor serve` on this port (bound to [http] host), supervised; "
        "needs API keys or --no-auth",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser(
        "status",
        parents=[one_shot],
        help="queues, workers (per kind), counters, events; exit 1 when a worker kind is missing",
    )
    p.add_argument("--recent", type=int, default=10)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "serve", parents=[common, no_auth], help="the HTTP API and the proxy (uvicorn)"
    )
    p.add_argument("--host", help="address to bind (default [http] host: 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default [http] port: 8080; 0: a free one)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("metrics", parents=[one_shot], help="Prometheus metrics (print or serve)")
    p.add_argument("--serve", type=int, metavar="PORT", help="serve /metrics on HOST:PORT")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind with --serve (default 127.0.0.1; 0.0.0.0 in a container)",
    )
    p.set_defaults(func=cmd_metrics)
