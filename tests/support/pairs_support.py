"""Whether a history keeps every tool call next to its result, in the wire formats' own shapes."""

from __future__ import annotations

from typing import Any


def openai_pairs_intact(messages: list[dict[str, Any]]) -> None:
    """Every tool call answered right after it, every result answering a call before it."""
    waiting: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in waiting, m
            waiting.remove(m["tool_call_id"])
        else:
            assert not waiting, f"calls without results before {m}"
        waiting |= {c["id"] for c in m.get("tool_calls") or []}
    assert not waiting


def anthropic_pairs_intact(messages: list[dict[str, Any]]) -> None:
    """Each message's ``tool_result`` blocks answer exactly the previous one's ``tool_use``."""
    waiting: set[str] = set()
    for m in messages:
        blocks = m["content"] if isinstance(m["content"], list) else []
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        assert results == waiting, (results, waiting)
        waiting = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    assert not waiting
