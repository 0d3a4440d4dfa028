"""The blocking-read check: every follower (``Client.events``, ``Client.aevents``,
``RedisState.read_events``) waits as long as it was told, with Redis healthy, and then gets
the event published after the wait.

Imported by tests/integration/test_idle_followers.py, and run as a script by it under another
redis-py
(``python tests/support/blocking_support.py URL...``, with that redis-py first on
``PYTHONPATH``): it
prints the redis-py it ran with, then checks each URL (standalone, ``redis+cluster://``,
``redis+sentinel://``) at the same time, and exits 1 with the tracebacks if any check failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import sys
import threading
import time
import traceback
import uuid
from datetime import UTC, datetime

from worker.client import Client
from worker.config import Settings
from worker.wire.events import CompactionEvent, skipped_event

#: Longer than every socket timeout in play: ours (READ_TIMEOUT_S, 10 s) and redis-py 8's
#: default (5 s). A read issued as one command of this BLOCK would time out client-side.
BLOCK_MS = 12_000
#: How much sooner than its BLOCK the wait may seem over: the slices' deadline is computed in
#: whole milliseconds.
ROUNDING_S = 0.05
DELIVERY_S = 60.0  # how long an event published after the wait may take to reach a follower


def client_of(url: str) -> Client:
    """A client of the state at ``url`` (no broker: nothing is submitted)."""
    return Client(Settings(redis={"url": url}, broker={"url": "redis://unused:1/0"}))


def published(client: Client, conversation_id: str, revision: int) -> CompactionEvent:
    """An event published on the conversation's stream the way a worker publishes it."""
    event = skipped_event(
        conversation_id, revision, datetime.now(UTC), why="idle-test", reason="test", trigger=None
    )
    assert client.state.publish(event, handled_revision=revision) == "published"
    return event


def check_blocking_reads(url: str, block_ms: int = BLOCK_MS) -> None:
    """A blocking read with nothing to read waits its whole ``block_ms`` and raises nothing,
    while a sync and an async follower wait beside it; the event published afterwards reaches
    both followers."""
    client = client_of(url)
    try:
        asyncio.run(_check(client, f"idle-{uuid.uuid4().hex[:12]}", block_ms))
    finally:
        client.close()


async def _first_async(client: Client, conversation_id: str, block_ms: int) -> str:
    follower = client.aevents(conversation_id, follow=True, block_ms=block_ms)
    async with contextlib.aclosing(follower):  # its connections closed before the loop ends
        async for _sid, event in follower:
            return event.event_id
    raise AssertionError("the async follower ended without an event")


async def _check(client: Client, conversation_id: str, block_ms: int) -> None:
    loop = asyncio.get_running_loop()
    stop = threading.Event()
    seen: list[str] = []

    def follow() -> None:
        for _sid, event in client.events(
            conversation_id, follow=True, block_ms=block_ms, stop=stop
        ):
            seen.append(event.event_id)
            return

    follower = loop.run_in_executor(None, follow)
    async_follower = asyncio.ensure_future(_first_async(client, conversation_id, block_ms))
    try:
        started = time.monotonic()
        read = await loop.run_in_executor(
            None, lambda: client.state.read_events(conversation_id, block_ms=block_ms)
        )
        waited = time.monotonic() - started
        assert read == [], read
        assert waited >= block_ms / 1000 - ROUNDING_S, f"returned after {waited:.2f}s"
        for name, future in (("sync", follower), ("async", async_follower)):
            if future.done():
                future.result()  # raises what ended it
                raise AssertionError(f"the {name} follower ended while idle")
        event = published(client, conversation_id, 1)
        assert await asyncio.wait_for(async_follower, DELIVERY_S) == event.event_id
        await asyncio.wait_for(follower, DELIVERY_S)
        assert seen == [event.event_id]
    finally:
        stop.set()  # a sync follower still waiting ends after its current wait
        async_follower.cancel()


def main(urls: list[str]) -> int:
    import redis

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    print(f"redis-py {importlib.metadata.version('redis')} from {redis.__file__}", flush=True)
    passed: list[str] = []
    failures: list[str] = []

    def run(url: str) -> None:
        try:
            check_blocking_reads(url)
            passed.append(url)
        except Exception:  # report every URL's outcome, not the first failure only
            failures.append(f"{url}:\n{traceback.format_exc()}")

    threads = [threading.Thread(target=run, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for url in passed:  # printed here, not by the threads: their lines would interleave
        print(f"ok {url}")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
