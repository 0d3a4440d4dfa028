"""Pins (docs/snapshot.md, "Pins"): a pinned message is carried word for word through every
compaction, never summarized, with the tool exchange it belongs to; pinned by the snapshot's
``pinned`` (own or derived ids), by the session, by the proxy's ``X-Compactor-Pin`` and over the
HTTP API, each through 50 compactions; its tokens count in the floor; a strategy keeps it too."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.http_support import KEY_A, Stack, proxy_config
from support.service_support import client_for

from worker.config import CompactionConfig, Settings
from worker.errors import InvalidSnapshot
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.session import CompactingSession
from worker.testing.standin_llm import StandinLLM
from worker.transcripts.filesystem import FileStore
from worker.wire import formats
from worker.wire.events import CompactionEvent, CompletedEvent
from worker.wire.history import apply_compaction

SPEC = {"role": "user", "content": "Spec: every price is in cents; never round; QUILL-7 applies."}
COMPACTIONS = 50


def turn(k: int, words: int = 160) -> list[dict[str, Any]]:
    cid = f"call{k}"
    arguments = json.dumps({"command": f"cat src/mod_{k}.py"})
    call = {"id": cid, "type": "function", "function": {"name": "bash", "arguments": arguments}}
    body = " ".join(f"line{k}_{i}" for i in range(words))
    return [
        {"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": cid, "content": body},
    ]


def pipeline(root: Path, **config: Any) -> Pipeline:
    settings = Settings(compaction=CompactionConfig(auto_compact_threshold_tokens=2500, **config))
    return Pipeline(settings, Adapters(store=FileStore(root)), Reuse())


def run(p: Pipeline, snap: dict[str, Any]) -> CompactionEvent:
    return p.run(p.parse(json.dumps(snap).encode()))[-1]


def assert_carried(history: list[dict[str, Any]], spec: dict[str, Any]) -> None:
    """The pinned message is in the history exactly once, word for word."""
    assert [m for m in history if {k: v for k, v in m.items() if k != "id"} == spec] != []


@pytest.mark.parametrize("reduction", ["summary", "truncation"])
def test_a_pinned_message_is_carried_word_for_word_through_50_compactions(
    tmp_path: Path, reduction: str
) -> None:
    """In process, an agent applying every compaction: the pinned message (by its own id) is
    in every replacement exactly as written, and never in a summary."""
    p = pipeline(tmp_path, reduction=reduction, reduction_max_messages=6)
    spec = {"id": "spec", **SPEC}
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix the pricing."}, spec]
    done, k = 0, 0
    while done < COMPACTIONS:
        assert k < 2000, done
        history += turn(k)
        event = run(
            p,
            {
                "conversation_id": "pin-1",
                "revision": k + 1,
                "messages": history,
                "pinned": ["spec"],
            },
        )
        if isinstance(event, CompletedEvent):
            done += 1
            assert spec in event.compaction.replacement, k
            assert "QUILL-7" not in event.compaction.summary.text
            history = apply_compaction(history, event)
        assert history.count(spec) == 1
        k += 1


def test_pins_follow_a_derived_id_as_compactions_move_the_message(tmp_path: Path) -> None:
    """An agent that keeps its full history (as a proxy's does) pins by derived ids: the worker
    applies the compactions so far and still knows which message is pinned."""
    p = pipeline(tmp_path)
    full: list[dict[str, Any]] = [{"role": "user", "content": "Fix the pricing."}, dict(SPEC)]
    published: list[CompletedEvent] = []
    for k in range(60):
        full += turn(k)
        pinned = [formats.source_ids(full)[1]]
        snap = {"conversation_id": "pin-2", "revision": k + 1, "messages": full, "pinned": pinned}
        parsed = p.parse(json.dumps(snap).encode(), published=published)
        events = p.run(parsed)
        if isinstance(events[-1], CompletedEvent):
            published.append(events[-1])
            assert SPEC in events[-1].compaction.replacement
    assert len(published) >= 5


def test_an_unknown_pinned_id_is_refused_naming_it(tmp_path: Path) -> None:
    p = pipeline(tmp_path)
    snap = {"conversation_id": "pin-3", "revision": 1, "messages": [SPEC], "pinned": ["nope"]}
    with pytest.raises(InvalidSnapshot) as info:
        p.parse(json.dumps(snap).encode())
    assert info.value.field == "pinned[0]" and "nope" in info.value.reason


def test_pinned_tokens_count_in_the_floor(tmp_path: Path) -> None:
    """A pin too large to leave room: the skip names it, counted."""
    p = pipeline(tmp_path)
    big = {
        "id": "big",
        "role": "user",
        "content": "Keep: " + " ".join(f"w{i}" for i in range(2500)),
    }
    history = [{"role": "user", "content": "Fix it."}, big, *turn(0, 40), *turn(1, 40)]
    event = run(
        p, {"conversation_id": "pin-4", "revision": 1, "messages": history, "pinned": ["big"]}
    )
    assert not isinstance(event, CompletedEvent)
    assert event.floor is not None and event.floor.pinned > 2500, event  # type: ignore[union-attr]


# --- through the session, the proxy and the HTTP API -----------------------------------------


def stack_config(llm: StandinLLM) -> str:
    return proxy_config(llm, threshold_tokens=2500, extra="max_persisted_transcripts = 5\n")


def settle(session: CompactingSession) -> None:
    deadline = time.monotonic() + 120
    while True:
        s = session.status
        if (
            s.pending_submits == 0
            and s.last_outcome_revision is not None
            and (
                s.last_submitted_revision is None
                or s.last_outcome_revision >= s.last_submitted_revision
            )
        ):
            return
        assert time.monotonic() < deadline, s
        time.sleep(0.01)


@pytest.mark.slow
def test_the_session_pins_a_message_through_50_compactions(stack: Stack) -> None:
    session = CompactingSession("pin-s", client=client_for(stack.workers), model="gpt-4.1")
    try:
        session.extend([{"role": "user", "content": "Fix the pricing."}])
        session.extend([dict(SPEC)], pin=True)  # no id of its own: pinned by what it says
        k = 0
        while len(session.compactions) < COMPACTIONS:
            assert k < 2000, session.status
            session.extend(turn(k))
            settle(session)
            request = session.request_messages()
            if session.compactions:
                assert_carried(request, SPEC)
            k += 1
        assert all(SPEC in e.compaction.replacement for e in session.compactions)
        state = session.state()
        assert state["pinned"]  # kept across a resume
    finally:
        session.close()


def outcomes(http: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    r = http.get(f"/v1/conversations/{conversation}/events?limit=1000")
    return r.json() if r.status_code == 200 else []


def wait_revision(http: httpx.Client, conversation: str, revision: int) -> list[dict[str, Any]]:
    for _ in range(1200):
        events = outcomes(http, conversation)
        if any(e["revision"] >= revision and e["type"] != "tool_results.elided" for e in events):
            return events
        time.sleep(0.05)
    raise AssertionError(f"no outcome of revision {revision}")


@pytest.mark.slow
def test_the_proxy_pins_by_position_through_50_compactions(stack: Stack, llm: StandinLLM) -> None:
    headers = {
        "X-Compactor-Conversation": "pin-p",
        "X-Compactor-Key": KEY_A,
        "X-Compactor-Pin": "1",
    }
    client = openai.OpenAI(
        base_url=f"{stack.base}/proxy/openai/v1",
        api_key="sk-agent",
        max_retries=0,
        default_headers=headers,
    )
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix the pricing."}, dict(SPEC)]
    completed = 0
    try:
        with stack.http() as http:
            for k in range(2000):
                history += turn(k)
                raw = client.chat.completions.with_raw_response.create(
                    model="gpt-4.1", messages=history
                )
                history.append(
                    {"role": "assistant", "content": raw.parse().choices[0].message.content}
                )
                sent = llm.requests[-1].body["messages"]
                if int(raw.headers.get("X-Compactor-Compactions", "0")):
                    assert sent.count(SPEC) == 1, k
                events = wait_revision(http, "pin-p", k + 1)
                completed = sum(e["type"] == "compaction.completed" for e in events)
                if completed >= COMPACTIONS:
                    break
    finally:
        client.close()
    assert completed >= COMPACTIONS
    bad = {"X-Compactor-Pin": "99"}
    refused = httpx.post(
        f"{stack.base}/proxy/openai/v1/chat/completions",
        headers={**headers, **bad},
        json={"model": "gpt-4.1", "messages": history[:2]},
    )
    assert refused.status_code == 422 and "X-Compactor-Pin" in refused.text


@pytest.mark.slow
def test_the_http_api_pins_through_50_compactions(stack: Stack) -> None:
    spec = {"id": "spec", **SPEC}
    history: list[dict[str, Any]] = [{"id": "task", "role": "user", "content": "Fix it."}, spec]
    done: list[dict[str, Any]] = []
    with stack.http() as http:
        for k in range(2000):
            for n, m in enumerate(turn(k)):
                history.append({"id": f"t{k}-{n}", **m})
            snap = {
                "conversation_id": "pin-h",
                "revision": k + 1,
                "messages": history,
                "pinned": ["spec"],
            }
            assert http.post("/v1/conversations/pin-h/snapshots", json=snap).status_code == 202
            events = wait_revision(http, "pin-h", k + 1)
            newest = [
                e for e in events if e["revision"] == k + 1 and e["type"] == "compaction.completed"
            ]
            if newest:
                done.append(newest[0])
                assert spec in newest[0]["compaction"]["replacement"]
                history = http.post(
                    "/v1/apply", json={"messages": history, "event": newest[0]}
                ).json()["messages"]
            if len(done) >= COMPACTIONS:
                break
    assert len(done) >= COMPACTIONS
