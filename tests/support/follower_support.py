"""Followers of a conversation's events for the tests, each in a thread of its own and
recording what it got: ``Client.events``, ``Client.aevents`` and an SSE stream of
``compactor serve``; a webhook receiver on loopback; a ``compactor serve`` with the default
settings.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.http_support import Stack
from support.webhook_support import Receiver
from worker.client import Client
from worker.wire.events import CompactionEvent

WAIT_S = 120.0  # the bound of every wait for something to happen


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.1)


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- followers -------------------------------------------------------------------------------


class SyncFollower:
    """``Client.events(follow=True)`` (with its default ``block_ms`` unless given), in a
    thread."""

    def __init__(self, client: Client, conversation_id: str, **how: Any) -> None:
        self.events: list[CompactionEvent] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(client, conversation_id, how), daemon=True
        )
        self._thread.start()

    def _run(self, client: Client, conversation_id: str, how: dict[str, Any]) -> None:
        try:
            for _sid, event in client.events(conversation_id, follow=True, stop=self._stop, **how):
                self.events.append(event)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class AsyncFollower:
    """``Client.aevents(follow=True)`` (with its default ``block_ms`` unless given), on an
    event loop of its own."""

    def __init__(self, client: Client, conversation_id: str, **how: Any) -> None:
        self.events: list[CompactionEvent] = []
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] = self._loop.create_task(
            self._follow(client, conversation_id, how)
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    async def _follow(self, client: Client, conversation_id: str, how: dict[str, Any]) -> None:
        async for _sid, event in client.aevents(conversation_id, follow=True, **how):
            self.events.append(event)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self._loop.close()

    def stop(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=30)


class SseFollower:
    """``GET .../events`` with ``Accept: text/event-stream``: its events and its comments."""

    def __init__(self, stack: Stack, conversation_id: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.comments: list[str] = []
        self.error: BaseException | None = None
        self._client = stack.http()
        self._cm = self._client.stream(
            "GET",
            f"/v1/conversations/{conversation_id}/events",
            headers={"Accept": "text/event-stream"},
            timeout=httpx.Timeout(30, read=WAIT_S),
        )
        self._response = self._cm.__enter__()
        assert self._response.status_code == 200, self._response.read()
        self._closing = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        data = None
        try:
            for line in self._response.iter_lines():
                if line.startswith(":"):
                    self.comments.append(line)
                elif line.startswith("data: "):
                    data = line[6:]
                elif line == "" and data is not None:
                    self.events.append(json.loads(data))
                    data = None
        except (httpx.HTTPError, RuntimeError) as exc:
            if not self._closing:
                self.error = exc

    def stop(self) -> None:
        self._closing = True
        self._client.close()
        self._thread.join(timeout=30)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def serve(redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    """``compactor serve`` with the default settings (webhooks may call loopback), no worker."""
    stack = Stack(tmp_path, redis_url, extra="[webhooks]\nallow_private = true\n")
    try:
        yield stack.start(workers=False)
    finally:
        stack.stop()
