"""Restoring (undoing) a compaction: ``POST /v1/conversations/{id}/compactions/{event_id}/restore``
against a real ``compactor serve``, Redis and worker. The ``compaction.reverted`` event is
published, the composition goes back one compaction, the proxy then forwards what the agent
had before that compaction, and ``CompactingSession`` / ``AsyncCompactingSession`` undo it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from support.http_support import KEY_B, Stack, first_proxy_turn, proxy_agent, proxy_config
from support.inspector_support import submit, wait_for_type
from support.service_support import REPO_ROOT, client_for, conversation

from worker.backend import keys
from worker.client import apply_compaction
from worker.session import AsyncCompactingSession, CompactingSession
from worker.testing.standin_llm import StandinLLM
from worker.wire.composed import ComposedCompaction

pytestmark = pytest.mark.slow

AGENT_KEY = "sk-agent-own-key-0123456789"


LLM_KEY = AGENT_KEY  # the stand-in demands the agent's own key


def stack_config(llm: StandinLLM) -> str:
    return proxy_config(llm)


def restore(stack: Stack, conversation_id: str, event_id: str, **body: Any) -> Any:
    """The answer to a restore; asked again while a worker still holds the conversation (it
    releases its lock right after publishing: the documented 409 says to try again)."""
    deadline = time.monotonic() + 60
    with stack.http() as client:
        while True:
            r = client.post(
                f"/v1/conversations/{conversation_id}/compactions/{event_id}/restore",
                content=json.dumps(body) if body else b"",
            )
            busy = r.status_code == 409 and r.json()["error"] == "compaction_in_progress"
            if not busy or time.monotonic() > deadline:
                return r
            time.sleep(0.05)


def compacted(stack: Stack, conversation_id: str, messages: list[dict[str, Any]]) -> Any:
    with stack.http() as client:
        r = client.post(
            f"/v1/conversations/{conversation_id}/compacted", json={"messages": messages}
        )
        assert r.status_code == 200, r.text
        return r.json()


def redis_of(stack: Stack) -> Any:
    return client_for(stack.workers).state.client


def test_restoring_the_only_compaction(stack: Stack) -> None:
    snap = conversation("r-1", 12)
    submit(stack, snap)
    events = wait_for_type(stack, "r-1", "compaction.completed")
    done = next(e for e in events if e["type"] == "compaction.completed")
    assert compacted(stack, "r-1", snap["messages"])["applied"] == 1

    assert restore(stack, "r-1", "0" * 32).status_code == 404
    assert restore(stack, "r-1", "not an id!").status_code in (404, 422)
    assert restore(stack, "r-1", done["event_id"], extra=1).status_code == 422
    with stack.http(key=KEY_B) as other:  # another tenant's: as if it did not exist
        r = other.post(f"/v1/conversations/r-1/compactions/{done['event_id']}/restore")
        assert r.status_code == 404

    r = restore(stack, "r-1", done["event_id"], reason="the summary lost the plan")
    assert r.status_code == 200, r.text
    reverted = r.json()
    assert reverted["type"] == "compaction.reverted"
    assert reverted["reverted_event_id"] == done["event_id"]
    assert reverted["reason"] == "the summary lost the plan"
    assert reverted["conversation_id"] == "r-1" and reverted["revision"] == done["revision"]
    schema = json.loads((REPO_ROOT / "docs/schemas/compaction.reverted.schema.json").read_text())
    published = {k: v for k, v in reverted.items() if k != "stream_id"}
    assert list(Draft202012Validator(schema).iter_errors(published)) == []

    with stack.http() as client:
        stream = client.get("/v1/conversations/r-1/events").json()
        assert stream[-1]["stream_id"] == reverted["stream_id"]
    redis = redis_of(stack)
    assert redis.get(keys.composed("acme:r-1")) is None  # it was the first: nothing composed
    assert redis.llen(keys.last_compaction("acme:r-1")) == 0
    # the full history goes out whole now; recall finds nothing any more
    after = compacted(stack, "r-1", snap["messages"])
    assert after["applied"] == 0 and after["messages"] == snap["messages"]
    with stack.http() as client:
        assert client.get("/v1/conversations/r-1/messages/a1").status_code == 404
    # restored once: there is nothing to restore any more
    again = restore(stack, "r-1", done["event_id"])
    assert again.status_code == 404, again.text


def test_no_restore_while_a_worker_holds_the_conversation(stack: Stack) -> None:
    submit(stack, conversation("r-busy", 12))
    events = wait_for_type(stack, "r-busy", "compaction.completed")
    done = next(e for e in events if e["type"] == "compaction.completed")
    redis = redis_of(stack)
    lock = keys.lock("acme:r-busy")
    _wait(lambda: redis.set(lock, "held-by-a-test", nx=True, ex=120), "the lock taken")
    try:
        with stack.http() as client:
            url = f"/v1/conversations/r-busy/compactions/{done['event_id']}/restore"
            r = client.post(url)
            assert r.status_code == 409 and r.json()["error"] == "compaction_in_progress"
            kinds = [e["type"] for e in client.get("/v1/conversations/r-busy/events").json()]
            assert "compaction.reverted" not in kinds
        assert redis.llen(keys.last_compaction("acme:r-busy")) == 1
    finally:
        redis.delete(lock)
    assert restore(stack, "r-busy", done["event_id"]).status_code == 200


def test_restoring_the_newest_of_two_takes_the_composition_back_one(stack: Stack) -> None:
    first = conversation("r-2", 12)
    submit(stack, first)
    wait_for_type(stack, "r-2", "compaction.completed")
    second = conversation("r-2", 24)  # the full history, grown: compacted again
    submit(stack, second)
    events = wait_for_type(stack, "r-2", "compaction.completed", count=2)
    older, newer = [e for e in events if e["type"] == "compaction.completed"]
    full = second["messages"]
    both = compacted(stack, "r-2", full)
    assert both["applied"] == 2 and both["event_id"] == newer["event_id"]

    r = restore(stack, "r-2", older["event_id"])
    assert r.status_code == 409 and r.json()["error"] == "not_newest"
    assert restore(stack, "r-2", newer["event_id"]).status_code == 200

    one = compacted(stack, "r-2", full)
    assert one["applied"] == 1 and one["event_id"] == older["event_id"]
    assert one["messages"] == apply_compaction(full, older)
    stored = redis_of(stack).get(keys.composed("acme:r-2"))
    composed = ComposedCompaction.model_validate_json(stored)
    assert composed.event_id == older["event_id"] and composed.previous is None
    # and the older one can be restored in turn (no composition left: one by one)
    assert restore(stack, "r-2", older["event_id"]).status_code == 200
    whole = compacted(stack, "r-2", full)
    assert whole["applied"] == 0 and whole["messages"] == full


def test_the_proxy_forwards_what_the_agent_had_after_a_restore(
    stack: Stack, llm: StandinLLM
) -> None:
    with proxy_agent(stack, "r-proxy", AGENT_KEY) as client:
        history = first_proxy_turn(client)
        events = wait_for_type(stack, "r-proxy", "compaction.completed")
        done = next(e for e in events if e["type"] == "compaction.completed")
        history.append({"role": "user", "content": "Now run the tests."})
        client.chat.completions.create(model="gpt-4.1", messages=history)
        assert len(llm.requests[-1].body["messages"]) < len(history)  # compacted
        # that exchange (revision 2) was submitted: its compacted history is under the threshold
        events = _outcome_of(stack, "r-proxy", 2)
        assert events[-1]["type"] == "compaction.skipped", events[-1]

        assert restore(stack, "r-proxy", done["event_id"]).status_code == 200
        history.append({"role": "assistant", "content": "ok"})
        history.append({"role": "user", "content": "And commit."})
        reply = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=history)
        assert llm.requests[-1].body["messages"] == history  # the whole history again
        assert reply.headers["x-compactor-compactions"] == "0"


def _outcome_of(stack: Stack, conversation_id: str, revision: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 90
    with stack.http() as client:
        while time.monotonic() < deadline:
            events = client.get(f"/v1/conversations/{conversation_id}/events").json()
            outcomes = [
                e
                for e in events
                if e["revision"] == revision and e["type"].startswith("compaction.")
            ]
            if outcomes:
                return outcomes
            time.sleep(0.1)
    raise AssertionError(f"no outcome of revision {revision} of {conversation_id}")


def _session_history() -> list[dict[str, Any]]:
    return conversation("unused", 12)["messages"]


def _wait(condition: Any, what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s}s")
        time.sleep(0.05)


def test_a_session_undoes_a_restored_compaction(stack: Stack) -> None:
    history = _session_history()
    session = CompactingSession(
        "acme:s-sync", client=client_for(stack.workers), model="gpt-4.1", context_window=8000
    )
    try:
        session.extend(history)
        assert session.wait_settled(timeout_s=120)
        _wait(lambda: bool(session.drain() or session.compactions), "compacted")
        done = session.compactions[-1]
        assert session.messages != history
        r = restore(stack, "s-sync", done.event_id)
        assert r.status_code == 200, r.text
        _wait(lambda: session.drain() or session.status.compactions_undone == 1, "undone")
        assert session.messages == history and session.compactions == []
        assert session.status.compactions_skipped == 0
    finally:
        session.close()


def test_an_async_session_undoes_a_restored_compaction(stack: Stack) -> None:
    history = _session_history()

    async def main() -> None:
        session = AsyncCompactingSession(
            "acme:s-async", client=client_for(stack.workers), model="gpt-4.1", context_window=8000
        )
        async with session:
            await session.extend(history)
            assert await session.wait_settled(timeout_s=120)
            deadline = time.monotonic() + 90
            while not session.compactions:
                assert time.monotonic() < deadline, "not compacted"
                await session.drain()
                await asyncio.sleep(0.05)
            done = session.compactions[-1]
            r = await asyncio.to_thread(restore, stack, "s-async", done.event_id)
            assert r.status_code == 200, r.text
            while session.status.compactions_undone < 1:
                assert time.monotonic() < deadline + 90, "not undone"
                await session.drain()
                await asyncio.sleep(0.05)
            assert session.messages == history and session.compactions == []

    asyncio.run(main())
