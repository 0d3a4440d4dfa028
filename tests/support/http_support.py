"""``compactor serve`` as a real subprocess (uvicorn on a loopback port), with real Redis and a
real worker process, shared by a test module: the fixtures :func:`stack` and :func:`llm` (the
module declares its config in ``stack_config`` and the stand-in's key in ``LLM_KEY``), and
:func:`framework_workers`, one worker shared by the framework integrations."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from support.service_support import (
    StartedWorkers,
    Workers,
    conversation,
    own_database,
    started_workers,
    write_config,
)
from worker.backend.embedded import EmbeddedRedis
from worker.testing.standin_llm import StandinLLM

KEY_A = "key-tenant-a-0123456789"
KEY_B = "key-tenant-b-0123456789"
API_KEYS = {KEY_A: "acme", KEY_B: "globex"}


class Stack:
    """A worker process and ``compactor serve``; ``base`` is the server's URL."""

    def __init__(
        self, root: Path, redis_url: str, extra: str = "", *, broker_url: str | None = None
    ) -> None:
        """``broker_url``: the queues' own Redis, when ``redis_url`` is a cluster's."""
        self.root = root
        self.transcripts = root / "transcripts"
        self.config = write_config(
            root / "compactor.toml", self.transcripts, extra, broker_url=broker_url
        )
        logs = root / "logs"
        logs.mkdir(exist_ok=True)
        self.workers = Workers(redis_url, self.config, logs, broker=broker_url)
        self.redis_url = redis_url
        self.server: subprocess.Popen[str] | None = None
        self.base = ""

    def start(self, *, workers: bool = True, env: dict[str, str] | None = None) -> Stack:
        if workers:
            self.workers.spawn("api-w")
        environ = self.workers.env() | {"COMPACTOR_API_KEYS": json.dumps(API_KEYS)} | (env or {})
        with (self.root / "logs" / "serve.log").open("ab") as log:  # the child keeps a copy
            self.server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "worker",
                    "serve",
                    "--port",
                    "0",
                    "--config",
                    str(self.config),
                ],
                env=environ,
                cwd=self.root,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        self.base = self._listening(timeout_s=30)
        if workers:
            self.workers.wait_ready(["api-w"])
        return self

    def _listening(self, timeout_s: float) -> str:
        assert self.server is not None and self.server.stdout is not None
        ready, _, _ = select.select([self.server.stdout], [], [], timeout_s)
        line = self.server.stdout.readline() if ready else ""
        if not line:
            log = (self.root / "logs" / "serve.log").read_text(errors="replace")
            raise RuntimeError(f"compactor serve did not start: {log[-3000:]}")
        url: str = json.loads(line)["http"]
        return url

    def restart_server(self) -> None:
        """A new ``compactor serve`` process (on a new port), the workers left running."""
        self._stop_server()
        self.start(workers=False)

    def stop(self) -> None:
        self._stop_server()
        self.workers.stop_all()

    def _stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()
        if self.server is not None and self.server.stdout is not None:
            self.server.stdout.close()

    def http(self, key: str | None = KEY_A, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=30, **kw)


@contextlib.contextmanager
def running_stack(root: Path, redis_url: str, extra: str = "") -> Iterator[Stack]:
    """A started :class:`Stack` (config ``extra``), stopped when the block ends."""
    s = Stack(root, redis_url, extra=extra)
    try:
        yield s.start()
    finally:
        s.stop()


def proxy_config(
    llm: StandinLLM, *, threshold_tokens: int = 4000, anthropic: bool = False, extra: str = ""
) -> str:
    """The proxy tests' config: compact above ``threshold_tokens`` (no percentage of the
    window), ``extra`` more ``[compaction]`` lines, and forward the proxy's OpenAI route (and
    its Anthropic one if ``anthropic``) to the stand-in ``llm``."""
    anthropic_url = f'anthropic_base_url = "{llm.anthropic_base_url}"\n' if anthropic else ""
    return f"""auto_compact_threshold_tokens = {threshold_tokens}
auto_compact_threshold_percent = "none"
{extra}[proxy]
openai_base_url = "{llm.openai_base_url}"
{anthropic_url}"""


def proxy_agent(stack: Stack, conversation_id: str, agent_key: str) -> openai.OpenAI:
    """The official OpenAI client of an agent behind the stack's proxy: its own ``agent_key``
    for the model, conversation ``conversation_id`` of tenant A, no retries."""
    return openai.OpenAI(
        base_url=f"{stack.base}/proxy/openai/v1",
        api_key=agent_key,
        max_retries=0,
        default_headers={"X-Compactor-Conversation": conversation_id, "X-Compactor-Key": KEY_A},
    )


def first_proxy_turn(client: openai.OpenAI) -> list[dict[str, Any]]:
    """A twelve-message history sent through the proxy once, with the model's answer appended:
    over the proxy tests' threshold, so the service compacts it."""
    history: list[dict[str, Any]] = conversation("x", 12)["messages"][:-1]
    for m in history:
        m.pop("id")
    first = client.chat.completions.create(model="gpt-4.1", messages=history)
    history.append({"role": "assistant", "content": first.choices[0].message.content})
    return history


#: The stack's config where its module declares none.
DEFAULT_STACK_CONFIG = "[http]\nmax_body_bytes = 1000000\nsse_keepalive_s = 1.0"


@pytest.fixture(scope="module")
def llm(request: pytest.FixtureRequest) -> Iterator[StandinLLM]:
    """The module's stand-in LLM (it records every request). It demands the key the module
    names in ``LLM_KEY`` (the agent's own provider key, say), and none if the module names none."""
    with StandinLLM(expected_key=getattr(request.module, "LLM_KEY", None)) as server:
        yield server


@pytest.fixture(scope="module")
def stack(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """The module's :class:`Stack` on the module's Redis, in a directory named after the module.

    Its config is what the module's ``stack_config`` returns, else :data:`DEFAULT_STACK_CONFIG`.
    ``stack_config`` names what it needs as parameters, as a fixture does: ``llm`` (the
    module's :func:`llm`, started only for a module that names it) and ``root`` (the stack's
    directory, for files the config points at); a parameter with a default is left to it."""
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    root = tmp_path_factory.mktemp(name.replace("_", "-"))
    declared = getattr(request.module, "stack_config", None)
    extra = DEFAULT_STACK_CONFIG
    if declared is not None:
        extra = declared(**_wanted(declared, request, root))
    with running_stack(root, redis_server, extra) as s:
        yield s


def _wanted(
    stack_config: Callable[..., str], request: pytest.FixtureRequest, root: Path
) -> dict[str, Any]:
    """The arguments ``stack_config`` names (see :func:`stack`)."""
    available: dict[str, Callable[[], Any]] = {
        "llm": lambda: request.getfixturevalue("llm"),
        "root": lambda: root,
    }
    arguments: dict[str, Any] = {}
    for parameter in inspect.signature(stack_config).parameters.values():
        if parameter.default is not inspect.Parameter.empty:
            continue
        if parameter.name not in available:
            raise TypeError(
                f"stack_config's parameter {parameter.name!r}: it may name "
                + ", ".join(sorted(available))
            )
        arguments[parameter.name] = available[parameter.name]()
    return arguments


@pytest.fixture(scope="session")
def framework_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartedWorkers]:
    """One worker (evaluate + summarize, the default config: ``local_only``, the offline
    digest) shared by the framework integration modules (LangChain, Agent Framework, ADK, OpenAI
    Agents) of this xdist process: each of their tests uses conversation ids of its own.

    On a Redis of its own: :func:`redis_server` empties the session's Redis whenever a module
    starts (this worker's queues and state with it), and a worker of this config left on the
    session's queues would take the tasks of later modules' stacks."""
    with _own_redis() as url, started_workers(url, tmp_path_factory.mktemp("frameworks")) as w:
        yield w


@contextlib.contextmanager
def _own_redis() -> Iterator[str]:
    """A private Redis; with ``$COMPACTOR_TEST_REDIS_URL``, a database of that server that no
    xdist process's :func:`redis_process` uses (those take the given number plus their index)."""
    explicit = os.environ.get("COMPACTOR_TEST_REDIS_URL")
    if explicit:
        index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        yield own_database(explicit, f"gw{count + index}")
        return
    with EmbeddedRedis() as url:
        yield url


def wait_events(
    client: httpx.Client, conversation_id: str, *, until: str, timeout_s: float = 30
) -> list[dict[str, Any]]:
    """The conversation's events (JSON), polled until one of type ``until`` is there."""
    deadline = time.monotonic() + timeout_s
    events: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        r = client.get(f"/v1/conversations/{conversation_id}/events")
        if r.status_code == 200:
            events = r.json()
            if any(e["type"] == until for e in events):
                return events
        time.sleep(0.1)
    raise AssertionError(f"no {until} for {conversation_id}: {events}")
