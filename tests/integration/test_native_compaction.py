"""A provider's own compaction is a boundary (docs/native-compaction.md): Anthropic's
``compaction`` block in each of its shapes and the Responses ``compaction`` item. What comes
before it is neither counted nor summarized; the block or item is carried byte for byte in the
applied history; ``content: null`` is no boundary; the count of an encrypted item says how it
was made; and through the proxy, the upstream receives the block as the agent sent it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import (
    ServerToolUseBlockParam,
    WebSearchResultBlockParam,
    WebSearchToolResultBlockParam,
)
from anthropic.types.beta import BetaCompactionBlockParam
from openai.types.responses.response_compaction_item_param_param import (
    ResponseCompactionItemParamParam,
)
from support.http_support import KEY_A, Stack, proxy_config, wait_events

from worker.config import CompactionConfig, Settings
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.testing.standin_llm import StandinLLM
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompactionEvent, CompletedEvent
from worker.wire.history import apply_compaction
from worker.wire.models import canonical_json

SIGNATURE = "RXF1aXZhbGVudFNpZ25hdHVyZU9wYXF1ZQ" * 4
ENCRYPTED = "gAAAAABoEncryptedCompactionPayload" * 20

SHAPES: dict[str, BetaCompactionBlockParam] = {
    "content": {"type": "compaction", "content": "Earlier: the parser lives in src/parse.py."},
    "encrypted": {
        "type": "compaction",
        "content": "Earlier: the parser lives in src/parse.py.",
        "encrypted_content": ENCRYPTED,
    },
    "signed": {
        "type": "compaction",
        "content": "Earlier: the parser lives in src/parse.py.",
        "signature": SIGNATURE,
        "tool_changes": [{"type": "tool_addition", "tool_name": "web_search"}],  # type: ignore[list-item]
    },
}


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def anthropic_turns(tag: str, count: int, size: int = 120) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(count):
        use = {"type": "tool_use", "id": f"toolu_{tag}{k}", "name": "bash", "input": {"k": k}}
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": words(tag, size)}
        out += [
            {"role": "assistant", "content": [{"type": "text", "text": f"{tag} step {k}."}, use]},
            {"role": "user", "content": [result]},
        ]
    return out


def run(tmp: Path, snap: dict[str, Any]) -> CompactionEvent:
    settings = Settings(compaction=CompactionConfig(auto_compact_threshold_tokens=3000))
    p = Pipeline(settings, Adapters(store=FileStore(tmp)), Reuse())
    return p.run(p.parse(json.dumps(snap).encode()))[-1]


def anthropic_snapshot(messages: list[dict[str, Any]], revision: int = 1) -> dict[str, Any]:
    return {
        "conversation_id": "native-a",
        "revision": revision,
        "format": "anthropic",
        "model": {"name": "gpt-4.1"},  # counted with tiktoken, exactly
        "messages": messages,
    }


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPES.keys())
def test_what_an_anthropic_compaction_block_superseded_is_not_counted_or_summarized(
    tmp_path: Path, shape: str
) -> None:
    before = [{"role": "user", "content": "Start."}, *anthropic_turns("old", 20, size=200)]
    boundary = {"role": "assistant", "content": [SHAPES[shape]]}
    after = [{"role": "user", "content": "Go on."}, *anthropic_turns("new", 20)]
    history = [*before, boundary, *after]
    event = run(tmp_path / "full", anthropic_snapshot(history))
    alone = run(tmp_path / "alone", anthropic_snapshot([before[0], boundary, *after]))
    assert isinstance(event, CompletedEvent) and isinstance(alone, CompletedEvent)
    assert event.trigger.native_compaction is True
    # nothing before the block counts: the same as the history without it
    assert event.trigger.projected_tokens == alone.trigger.projected_tokens
    c = event.compaction
    assert c.start > len(before)  # our range starts after the boundary
    assert "old" not in c.summary.text and SIGNATURE not in event.to_json()
    assert ENCRYPTED not in event.to_json()
    applied = apply_compaction(history, event)
    assert canonical_json(applied[: len(before) + 1]) == canonical_json([*before, boundary])
    assert len(applied) < len(history)


def test_a_failed_compaction_is_no_boundary(tmp_path: Path) -> None:
    failed: BetaCompactionBlockParam = {"type": "compaction", "content": None}
    history = [
        {"role": "user", "content": "Start."},
        *anthropic_turns("old", 10),
        {"role": "assistant", "content": [failed]},
        {"role": "user", "content": "Go on."},
        *anthropic_turns("new", 10),
    ]
    event = run(tmp_path, anthropic_snapshot(history))
    assert isinstance(event, CompletedEvent)
    assert event.trigger.native_compaction is False
    assert event.compaction.start <= 1  # the old turns are compacted like any
    applied = apply_compaction(history, event)
    assert {"role": "assistant", "content": [failed]} not in applied[1:] or len(applied) > 2


def responses_turns(tag: str, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(count):
        call = {"type": "function_call", "call_id": f"call_{tag}{k}", "name": "bash"}
        call["arguments"] = json.dumps({"k": k})
        output = {"type": "function_call_output", "call_id": call["call_id"]}
        out += [call, {**output, "output": words(tag, 120)}]
    return out


def responses_snapshot(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "conversation_id": "native-r",
        "revision": 1,
        "format": "responses",
        "model": {"name": "gpt-4.1"},
        "messages": messages,
        **extra,
    }


def test_a_responses_compaction_item_is_a_boundary_counted_by_its_stated_estimate(
    tmp_path: Path,
) -> None:
    item: ResponseCompactionItemParamParam = {
        "type": "compaction",
        "id": "cmp_0123",
        "encrypted_content": ENCRYPTED,
    }
    before = [{"role": "user", "content": "Start."}, *responses_turns("old", 15)]
    after = [{"role": "user", "content": "Go on."}, *responses_turns("new", 20)]
    history = [*before, dict(item), *after]
    event = run(tmp_path / "a", responses_snapshot(history))
    assert isinstance(event, CompletedEvent), event
    t = event.trigger
    assert t.native_compaction is True and t.counted_by == "tiktoken+opaque-estimate"
    c = event.compaction
    assert c.start > len(before)
    assert "old" not in c.summary.text and ENCRYPTED not in event.to_json()
    applied = apply_compaction(history, event)
    assert applied[len(before)] == item  # the item itself, id and all
    # the agent's usage of a request that held it: counted by the provider, and said so
    usage = {"input_tokens": t.projected_tokens, "message_count": len(before) + 3}
    measured = run(tmp_path / "b", responses_snapshot(history, usage=usage))
    assert measured.trigger is not None
    assert measured.trigger.counted_by == "usage+tiktoken"


# --- through the proxy -----------------------------------------------------------------------


def stack_config(llm: StandinLLM) -> str:
    return proxy_config(llm, threshold_tokens=3000, anthropic=True)


@pytest.mark.slow
def test_through_the_proxy_the_block_goes_upstream_as_the_agent_sent_it(
    stack: Stack, llm: StandinLLM
) -> None:
    """The official SDK drives the conversation until our compaction lands; then a request
    written as another JSON library would (indented, non-ASCII escaped) goes through the
    proxy, and the upstream receives the compaction block's very bytes."""
    headers = {"X-Compactor-Conversation": "native-p", "X-Compactor-Key": KEY_A}
    client = anthropic.Anthropic(
        base_url=f"{stack.base}/proxy/anthropic",
        api_key="sk-agent",
        max_retries=0,
        default_headers=headers,
    )
    block = {**SHAPES["signed"], "content": "Earlier: café, the parser in src/parse.py."}
    history: list[Any] = [
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": "Go on."},
        *anthropic_turns("new", 20),
    ]
    try:
        client.messages.create(model="claude-x", max_tokens=100, messages=history)
        with stack.http() as http:
            wait_events(http, "native-p", until="compaction.completed", timeout_s=60)
    finally:
        client.close()
    history.append({"role": "user", "content": "And now?"})
    raw = json.dumps({"model": "claude-x", "max_tokens": 100, "messages": history}, indent=1)
    with httpx.Client(base_url=stack.base, timeout=60) as http:
        reply = http.post(
            "/proxy/anthropic/v1/messages",
            content=raw.encode(),
            headers={**headers, "x-api-key": "sk-agent", "anthropic-version": "2023-06-01",
                     "content-type": "application/json"},
        )  # fmt: skip
    assert reply.status_code == 200, reply.text
    upstream = llm.requests[-1]
    assert len(upstream.body["messages"]) < len(history)  # our compaction was applied ...
    assert upstream.body["messages"][1] == history[1]  # ... after the provider's
    written = json.dumps(history[1], indent=1)  # the block's message as this agent wrote it
    assert "\\u00e9" in written
    sent = upstream.raw_body.decode()
    assert all(line in sent for line in written.splitlines())
    assert sent.count(SIGNATURE) == 1


def test_signed_thinking_leaves_carried_turns_and_stays_on_the_newest(tmp_path: Path) -> None:
    """Anthropic's rules for thinking across turns, applied: an assistant turn carried into the
    replacement (a call kept by its tool's hint) goes without its thinking (what precedes it is
    no longer what the signature covered); the newest turn keeps its thinking exactly; the
    transcript keeps every original."""
    thinking = {"type": "thinking", "thinking": "Check the plan.", "signature": SIGNATURE}
    redacted = {"type": "redacted_thinking", "data": ENCRYPTED}
    use = {"type": "tool_use", "id": "toolu_plan", "name": "plan", "input": {"step": 1}}
    text = {"type": "text", "text": "Plan."}
    kept = {"role": "assistant", "content": [thinking, redacted, text, use]}
    result = {"type": "tool_result", "tool_use_id": "toolu_plan", "content": "1. parse"}
    newest = {"role": "assistant", "content": [dict(thinking), {"type": "text", "text": "Done."}]}
    history = [
        {"role": "user", "content": "Start."},
        kept,
        {"role": "user", "content": [result]},
        *anthropic_turns("mid", 20),
        {"role": "user", "content": "Finish."},
        newest,
    ]
    snap = anthropic_snapshot(history) | {"tools": {"plan": {"compaction": "keep"}}}
    event = run(tmp_path, snap)
    assert isinstance(event, CompletedEvent), event
    replacement = event.compaction.replacement
    carried = [m for m in replacement if m["role"] == "assistant"]
    assert carried, replacement
    blocks = [b["type"] for m in carried for b in m["content"]]
    assert "tool_use" in blocks and "thinking" not in blocks and "redacted_thinking" not in blocks
    applied = apply_compaction(history, event)
    assert applied[-1] == newest  # the newest turn, its thinking as it was
    assert SIGNATURE not in json.dumps(replacement) and ENCRYPTED not in json.dumps(replacement)
    stored = json.loads(next(tmp_path.rglob("*.json")).read_text())
    assert stored["messages"][1] == kept  # the transcript keeps the original


def web_search_turn(k: int) -> dict[str, Any]:
    """An assistant turn that used the server's web search: its use, the encrypted results and
    the answer, as the Messages API returns them (the SDK's own block types)."""
    use: ServerToolUseBlockParam = {
        "type": "server_tool_use",
        "id": f"srvtoolu_{k:04d}",
        "name": "web_search",
        "input": {"query": f"release notes of lib{k}"},
    }
    hit: WebSearchResultBlockParam = {
        "type": "web_search_result",
        "url": f"https://lib{k}.example.org/notes",
        "title": f"lib{k} notes",
        "encrypted_content": f"{ENCRYPTED}{k:04d}",
        "page_age": "2 days ago",
    }
    result: WebSearchToolResultBlockParam = {
        "type": "web_search_tool_result",
        "tool_use_id": use["id"],
        "content": [hit],
    }
    text = {"type": "text", "text": f"lib{k} changed its parser. " + words(f"w{k}_", 150)}
    return {"role": "assistant", "content": [use, result, text]}


@pytest.mark.slow
def test_a_web_search_agent_through_the_proxy_over_80_turns(stack: Stack, llm: StandinLLM) -> None:
    """A long session of an agent using the server's web search through the proxy, the
    provider compacting natively midway: every turn accepted (never rejected), every request
    bounded once our compactions come, the provider's compaction block and every kept search
    result going upstream as they came, to the end."""
    headers = {"X-Compactor-Conversation": "native-ws", "X-Compactor-Key": KEY_A}
    client = anthropic.Anthropic(
        base_url=f"{stack.base}/proxy/anthropic", api_key="sk-agent", max_retries=0,
        default_headers=headers,
    )  # fmt: skip
    history: list[Any] = [{"role": "user", "content": "Which libraries changed their parser?"}]
    largest_after = 0
    try:
        for k in range(80):
            if k == 40:  # the provider's own compaction of everything so far
                history.append({"role": "assistant", "content": [SHAPES["signed"]]})
                history.append({"role": "user", "content": "Go on."})
            history.append(web_search_turn(k))
            history.append({"role": "user", "content": f"And lib{k + 1}?"})
            raw = client.messages.with_raw_response.create(
                model="claude-x", max_tokens=50, messages=history
            )
            outcome = raw.headers.get("X-Compactor-Outcome", "")
            assert "rejected" not in outcome, (k, outcome)
            sent = llm.requests[-1].body["messages"]
            assert sent[-1] == history[-1]
            if int(raw.headers.get("X-Compactor-Compactions", "0")):
                largest_after = max(largest_after, len(json.dumps(sent)))
            if k > 40:
                blocks = [b for m in sent if isinstance(m["content"], list) for b in m["content"]]
                assert SHAPES["signed"] in blocks, k
            wait_turn(stack, "native-ws", k + 1)
    finally:
        client.close()
    assert largest_after, "no compaction was ever applied"
    assert largest_after < len(json.dumps(history)) / 3  # bounded, to the end
    with stack.http() as http:
        events = http.get("/v1/conversations/native-ws/events?limit=1000").json()
    assert not [e for e in events if e["type"] in ("compaction.rejected", "compaction.failed")]
    completed = [e for e in events if e["type"] == "compaction.completed"]
    assert len(completed) >= 3
    assert any(e["trigger"]["native_compaction"] for e in completed)
    assert all(ENCRYPTED not in json.dumps(e) for e in events)


def wait_turn(stack: Stack, conversation_id: str, revision: int) -> None:
    """Until the outcome of the snapshot the proxy submitted for this turn is published."""
    with stack.http() as http:
        for _ in range(600):
            r = http.get(f"/v1/conversations/{conversation_id}/events?limit=1000")
            if r.status_code == 200 and any(
                e["revision"] >= revision and e["type"] != "tool_results.elided" for e in r.json()
            ):
                return
            time.sleep(0.1)
    raise AssertionError(f"no outcome of revision {revision}")
