"""The agent-side client against a real Redis: validation before anything is stored, and asyncio
use in which submits and followers never wait for each other."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
import redis
from service_support import redis_server, redis_url  # noqa: F401 - fixtures: a real Redis

from worker import keys
from worker.client import Client
from worker.config import Settings, with_redis_url
from worker.errors import InvalidSnapshot
from worker.events import SkippedEvent
from worker.redis_state import RedisState, connect

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def snapshot(conversation_id: str = "c-client", revision: int = 1, **extra: Any) -> dict[str, Any]:
    messages = [{"id": "u1", "role": "user", "content": "hello"}]
    return {"conversation_id": conversation_id, "revision": revision, "messages": messages} | extra


def client_for(url: str) -> Client:
    return Client(with_redis_url(Settings(), url))


def test_importing_the_client_imports_no_celery() -> None:
    code = (
        "import sys, worker.client; "
        "c = worker.client.Client; "
        "assert not [m for m in sys.modules if m == 'celery' or m.startswith('celery.')], "
        "sorted(m for m in sys.modules if m.startswith('celery'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (snapshot(messages=[{"role": "user", "content": "lone \ud800 surrogate"}]), "messages[0]"),
        (snapshot(messages=[{"role": "user", "content": b"bytes"}]), "messages[0].content"),
        (snapshot(config={"summary_max_input_chars": float("nan")}), "config"),
        (snapshot(model={"name": "gpt-4.1", "context_window": float("inf")}), "model"),
    ],
    ids=["surrogate", "bytes", "nan", "infinity"],
)
def test_submit_names_the_field_json_cannot_carry(bad: dict[str, Any], field: str) -> None:
    client = client_for("redis://127.0.0.1:1/0")  # nothing is sent: the check comes first
    try:
        with pytest.raises(InvalidSnapshot) as caught:
            client.submit(bad)
        assert caught.value.field.startswith(field), caught.value.field
    finally:
        client.close()


@pytest.mark.parametrize("text", ['{"revision": NaN}', '{"x": [Infinity]}', '{"x": 1e400}'])
def test_submit_refuses_json_that_strict_parsers_refuse(text: str) -> None:
    client = client_for("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(InvalidSnapshot, match="finite"):
            client.submit(text.encode())
    finally:
        client.close()


def test_a_lone_surrogate_in_text_input_is_an_invalid_snapshot() -> None:
    client = client_for("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(InvalidSnapshot, match="surrogate"):
            client.submit(json.dumps(snapshot())[:-1] + ', "x": "\ud800"}')
    finally:
        client.close()


def test_asubmit_does_not_wait_behind_idle_followers(redis_url: str) -> None:
    """Eight followers wait on conversations that get no event for a minute; a submit made
    meanwhile completes while every one of them is still waiting. (With followers and
    submits on asyncio's shared default thread pool, the submit waited for a follower's
    blocking read to time out.)"""

    async def scenario() -> tuple[str, list[bool]]:
        client = client_for(redis_url)
        waiting = [True] * 8

        async def follow(i: int) -> None:
            async for _ in client.aevents(f"c-idle-{i}", follow=True, block_ms=60_000):
                break
            waiting[i] = False

        followers = [asyncio.create_task(follow(i)) for i in range(8)]
        await asyncio.sleep(0.2)  # let them all start waiting
        try:
            result = await asyncio.wait_for(client.asubmit(snapshot("c-busy")), timeout=30)
            still = list(waiting)
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
            client.close()
        return result.status, still

    status, still_waiting = asyncio.run(scenario())
    assert status == "queued"
    assert all(still_waiting)


def test_followers_receive_events_while_submits_run(redis_url: str) -> None:
    async def scenario() -> list[str]:
        client = client_for(redis_url)
        state = RedisState(connect(redis_url), Settings().redis)
        got: list[str] = []

        async def follow(i: int) -> None:
            async for _, event in client.aevents(f"c-f{i}", follow=True, block_ms=60_000):
                got.append(event.conversation_id)
                break

        followers = [asyncio.create_task(follow(i)) for i in range(8)]
        await asyncio.gather(*(client.asubmit(snapshot(f"c-s{i}")) for i in range(20)))
        for i in range(8):
            event = SkippedEvent(
                event_id=f"e{i}",
                conversation_id=f"c-f{i}",
                revision=1,
                created_at="2026-12-01T00:00:00Z",
                reason="test",
            )
            state.publish(event)
        try:
            await asyncio.wait_for(asyncio.gather(*followers), timeout=60)
        finally:
            client.close()
            state.client.close()
        return got

    assert sorted(asyncio.run(scenario())) == sorted(f"c-f{i}" for i in range(8))


def test_a_stream_entry_that_is_not_an_event_is_skipped_not_fatal(redis_url: str) -> None:
    raw = redis.Redis.from_url(redis_url)
    stream = keys.events("c-odd")
    raw.xadd(stream, {"event": json.dumps({"type": "compaction.skipped"})})  # no ids at all
    good = {
        "type": "compaction.skipped",
        "event_id": "e2",
        "conversation_id": "c-odd",
        "revision": 2,
        "created_at": "2026-12-01T00:00:00Z",
        "reason": "below",
        "from_the_future": True,
    }
    raw.xadd(stream, {"event": json.dumps(good)})
    client = client_for(redis_url)
    try:
        events = [e for _, e in client.events("c-odd")]
        assert [e.event_id for e in events] == ["e2"]

        async def read() -> list[str]:
            return [e.event_id async for _, e in client.aevents("c-odd")]

        assert asyncio.run(read()) == ["e2"]
    finally:
        client.close()
        raw.close()
