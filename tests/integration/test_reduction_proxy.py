"""The proxy under ``[compaction] reduction = "sliding_window"``, driven by the official ``openai``
SDK against the stand-in provider through a real ``compactor serve``, Redis and worker: once the
compaction arrived, the upstream receives the strategy's history (the event applied to what the
agent sent), tool calls paired, the marker in place of what was dropped."""

from __future__ import annotations

from typing import Any

import pytest
from support.http_support import Stack, proxy_agent, proxy_config, wait_events
from support.service_support import conversation

from worker.testing.standin_llm import StandinLLM
from worker.wire.events import SUMMARY_MARKER, parse_event
from worker.wire.history import apply_compaction

pytestmark = pytest.mark.slow

AGENT_KEY = "sk-agent-own-key-0123456789"
WINDOW = 8


LLM_KEY = AGENT_KEY  # the stand-in demands the agent's own key


def stack_config(llm: StandinLLM) -> str:
    extra = f'reduction = "sliding_window"\nreduction_window = {WINDOW}\n'
    return proxy_config(llm, extra=extra)


def history(turns: int) -> list[dict[str, Any]]:
    """An agent's Chat Completions history as an SDK user keeps it: no ids."""
    messages = conversation("x", turns)["messages"][:-1]
    for m in messages:
        m.pop("id")
    return messages


def test_the_upstream_receives_the_strategys_history(stack: Stack, llm: StandinLLM) -> None:
    client = proxy_agent(stack, "p-red", AGENT_KEY)
    try:
        messages = history(12)
        first = client.chat.completions.create(model="gpt-4.1", messages=messages)
        messages.append({"role": "assistant", "content": first.choices[0].message.content})
        with stack.http() as http:
            events = wait_events(http, "p-red", until="compaction.completed", timeout_s=40)
        event = parse_event(next(e for e in events if e["type"] == "compaction.completed"))
        assert event.compaction.reduction == "sliding_window"

        messages.append({"role": "user", "content": "Now run the tests."})
        client.chat.completions.create(model="gpt-4.1", messages=messages)
        sent = llm.requests[-1].body["messages"]
        assert sent == apply_compaction(messages, event)
        non_system = [m for m in sent if m["role"] != "system"]
        markers = [m for m in sent if str(m.get("content", "")).startswith(SUMMARY_MARKER)]
        assert len(markers) == 1 and "sliding_window" in markers[0]["content"]
        # the window's messages, the marker, and what came after the compacted snapshot
        assert len(non_system) <= WINDOW + 1 + 2
        calls = [c["id"] for m in sent for c in m.get("tool_calls") or []]
        assert sorted(calls) == sorted(m["tool_call_id"] for m in sent if m["role"] == "tool")
    finally:
        client.close()
