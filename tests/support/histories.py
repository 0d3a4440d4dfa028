"""Hypothesis strategies for valid agent histories in the OpenAI wire format (our own)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

TOOLS = ["bash", "grep", "read_file", "delegate_task", "edit_file"]
WORDS = [
    "alpha",
    "beta",
    "src/app.py",
    "tests/test_app.py",
    "Error: boom",
    "ok",
    "λ",
    "🙂",
    "\n",
    "    ",
    "def f():",
    "FAILED tests/x.py::t",
    "/etc/config.toml",
]

texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=40).map(" ".join)
long_texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=400).map(" ".join)


@st.composite
def tool_turn(draw: st.DrawFn, n: int, *, answered: bool = True) -> list[dict[str, Any]]:
    """An assistant message calling 1-3 tools, then (when answered) each result."""
    calls = []
    for k in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(TOOLS))
        args = {"command": draw(texts), "path": draw(st.sampled_from(WORDS[2:4] + WORDS[-1:]))}
        calls.append(
            {
                "id": f"call_{n}_{k}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        )
    turn: list[dict[str, Any]] = [
        {"role": "assistant", "content": draw(texts) or None, "tool_calls": calls}
    ]
    if answered:
        turn += [
            {"role": "tool", "tool_call_id": c["id"], "content": draw(long_texts)} for c in calls
        ]
    return turn


@st.composite
def histories(draw: st.DrawFn, *, max_turns: int = 14) -> list[dict[str, Any]]:
    """Optional system prompt, then user / assistant / tool turns; maybe a pending call last."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts) or "system"})
    for n in range(draw(st.integers(1, max_turns))):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "tools"]))
        if kind == "user":
            messages.append({"role": "user", "content": draw(long_texts) or "go"})
        elif kind == "assistant":
            messages.append({"role": "assistant", "content": draw(texts) or "ok"})
        else:
            messages.extend(draw(tool_turn(n)))
    if draw(st.booleans()):
        messages.extend(draw(tool_turn(999, answered=False)))
    if draw(st.booleans()):  # explicit ids on every message, or none at all
        for i, m in enumerate(messages):
            m["id"] = f"id{i}"
    return messages


def snapshot(
    messages: list[dict[str, Any]],
    *,
    window: int | None = None,
    threshold: int | None = 50_000,
    **extra: Any,
) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "conversation_id": "conv-1",
        "revision": len(messages),
        "model": {"name": "gpt-4.1", "context_window": window},
        "messages": messages,
        "config": {"auto_compact_threshold_tokens": threshold},
    }
    snap.update(extra)
    return snap
