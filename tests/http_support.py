"""``compactor serve`` as a real subprocess (uvicorn on a loopback port), with real Redis and a
real worker process, shared by a test module."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import Workers, write_config

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


@pytest.fixture(scope="module")
def stack(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    extra = "[http]\nmax_body_bytes = 1000000\nsse_keepalive_s = 1.0"
    with running_stack(tmp_path_factory.mktemp("http"), redis_server, extra) as s:
        yield s


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
