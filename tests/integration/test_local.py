"""What scripts and examples use instead of private helpers and polling loops:
``worker.local.local_stack`` (the service for the length of a block) and
``CompactingSession.wait_settled`` (until the service has answered the newest turn), against
the real processes they start."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support.service_support import conversation, write_config

from worker.backend.embedded import free_port
from worker.client import Client
from worker.config import Settings, with_redis_url
from worker.errors import ConfigError
from worker.local import LocalStack, local_stack
from worker.session import AsyncCompactingSession, CompactingSession
from worker.wire.events import CompletedEvent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, subprocesses: None) -> Iterator[LocalStack]:
    """One stack for the module: an embedded Redis, the workers and the scheduler."""
    tmp = tmp_path_factory.mktemp("local")
    config = write_config(tmp / "compactor.toml", tmp / "transcripts")
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith("COMPACTOR_")]:
            env.delenv(name)  # the stack embeds its own Redis, whatever the caller's shell says
        with local_stack(config, workdir=tmp / "work") as running:
            yield running


def test_the_block_starts_with_every_part_ready_and_ends_with_none_running(
    tmp_path: Path,
    subprocesses: None,
) -> None:
    config = write_config(tmp_path / "compactor.toml", tmp_path / "transcripts")
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith("COMPACTOR_")]:
            env.delenv(name)
        # refused before anything starts
        with pytest.raises(ConfigError, match="no API keys"), local_stack(config, http_port=port):
            pass
        env.setenv("COMPACTOR_API_KEYS", json.dumps({"local-test-key-0123456789": "acme"}))
        with local_stack(config, http_port=port) as running:
            assert running.http_url == f"http://127.0.0.1:{port}"
            assert healthz(port) == 200  # ready when the block starts: no waiting here
            client = Client(running.settings)
            try:
                snap = conversation("c-local", 12)
                client.submit(snap)
                event = client.wait_for("c-local", revision=snap["revision"], timeout_s=120)
                assert isinstance(event, CompletedEvent)
                assert client.restore(event) == snap["messages"]
            finally:
                client.close()
            workdir = running.workdir
            assert sorted(p.name for p in running.logs.iterdir()) == [
                "beat.log",
                "evaluate.log",
                "http.log",
                "summarize.log",
            ]
            url = running.redis_url
    assert not workdir.exists()  # the private work directory (Redis' AOF) is removed
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=5).ping()
    with pytest.raises(OSError):
        healthz(port)


def healthz(port: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    finally:
        connection.close()


def test_wait_settled_returns_once_the_newest_turn_is_answered_and_applicable(
    stack: LocalStack,
) -> None:
    """After ``wait_settled``, the compaction of the newest turn is in the session's hands:
    ``request_messages`` applies it without waiting."""
    client = Client(stack.settings)
    snap = conversation("c-settled", 12)
    session = CompactingSession("c-settled", client=client, model="gpt-4.1", context_window=8000)
    try:
        session.extend(snap["messages"])
        assert session.wait_settled(timeout_s=120)
        status = session.status
        assert status.pending_submits == 0
        assert status.last_outcome_revision == status.last_submitted_revision
        session.request_messages()
        assert len(session.compactions) == 1
        assert len(session.messages) < len(snap["messages"])
    finally:
        session.close()
        client.close()


def test_wait_settled_is_false_when_no_answer_comes(subprocesses: None) -> None:
    """A turn the service never answers: its snapshot cannot even be submitted."""
    client = Client(with_redis_url(Settings(), "redis://127.0.0.1:1/0"))  # nothing listens
    session = CompactingSession("c-unanswered", client=client)
    try:
        assert session.wait_settled(timeout_s=0)  # nothing asked yet: nothing to wait for
        session.extend([{"id": "u1", "role": "user", "content": "hello"}])
        assert not session.wait_settled(timeout_s=1.0)
        assert session.status.pending_submits == 1
    finally:
        session.close(timeout_s=0)
        client.close()


def test_the_asyncio_session_waits_without_holding_its_loop(stack: LocalStack) -> None:
    """The async session's sender and follower are tasks on the same loop: the wait settles
    only because it leaves the loop free for them."""
    snap = conversation("c-settled-async", 12)

    async def scenario() -> tuple[bool, int]:
        client = Client(stack.settings)
        session = AsyncCompactingSession(
            "c-settled-async", client=client, model="gpt-4.1", context_window=8000
        )
        try:
            await session.extend(snap["messages"])
            settled = await session.wait_settled(timeout_s=120)
            await session.request_messages()
            return settled, len(session.compactions)
        finally:
            await session.close()
            client.close()

    assert asyncio.run(scenario()) == (True, 1)
