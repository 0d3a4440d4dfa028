"""Wire formats (DESIGN.md §3): OpenAI Chat Completions and Anthropic Messages normalize to one
internal shape; derived ids are stable; pairing and roles are validated with the field named."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from worker.errors import InvalidSnapshot
from worker.wire import formats
from worker.wire.models import Message, WireFormat

# One conversation, written once per format.
SYSTEM = "You are a coding agent."
TASK = "Fix the failing test in src/app.py."
ARGS = {"pattern": "def main", "path": "src"}
GREP_OUT = "src/app.py:3:def main():"
EDIT_ARGS = {"path": "src/app.py", "patch": "- return 1\n+ return 0"}

OPENAI: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {
        "role": "user",
        "content": [{"type": "text", "text": TASK}, {"type": "text", "text": "Thanks!"}],
    },
    {
        "role": "assistant",
        "content": "Searching first.",
        "reasoning_content": "Where is main defined?",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "grep", "arguments": json.dumps(ARGS)},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "edit", "arguments": json.dumps(EDIT_ARGS)},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": GREP_OUT},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "ok"}]},
    {"role": "user", "content": "Now run the tests."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_3",
                "type": "function",
                "function": {"name": "run_tests", "arguments": "{}"},
            }
        ],
    },
]

ANTHROPIC: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": TASK},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
            },
            {"type": "text", "text": "Thanks!"},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Where is main defined?", "signature": "s"},
            {"type": "text", "text": "Searching first."},
            {"type": "tool_use", "id": "call_1", "name": "grep", "input": ARGS},
            {"type": "tool_use", "id": "call_2", "name": "edit", "input": EDIT_ARGS},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": GREP_OUT},
            {
                "type": "tool_result",
                "tool_use_id": "call_2",
                "content": [{"type": "text", "text": "ok"}],
            },
            {"type": "text", "text": "Now run the tests."},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "call_3", "name": "run_tests", "input": {}},
        ],
    },
]


def shape(messages: list[Message]) -> list[tuple[Any, ...]]:
    """What both formats must agree on (ids and positions are format-specific)."""
    return [
        (
            m.role,
            m.content,
            m.reasoning,
            [(c.id, c.name, json.loads(c.arguments)) for c in m.tool_calls],
            m.tool_call_id,
            m.tool_name,
        )
        for m in messages
    ]


EXPECTED_SHAPE = [
    ("system", SYSTEM, "", [], None, None),
    ("user", TASK + "\nThanks!", "", [], None, None),
    (
        "assistant",
        "Searching first.",
        "Where is main defined?",
        [("call_1", "grep", ARGS), ("call_2", "edit", EDIT_ARGS)],
        None,
        None,
    ),
    ("tool", GREP_OUT, "", [], "call_1", "grep"),
    ("tool", "ok", "", [], "call_2", "edit"),
    ("user", "Now run the tests.", "", [], None, None),
    ("assistant", "", "", [("call_3", "run_tests", {})], None, None),
]


def test_openai_normalizes() -> None:
    assert shape(formats.to_messages("openai", OPENAI)) == EXPECTED_SHAPE


def test_anthropic_normalizes_to_the_same_shape() -> None:
    messages = formats.to_messages("anthropic", ANTHROPIC, system=SYSTEM)
    assert shape(messages) == EXPECTED_SHAPE


def test_anthropic_system_as_blocks() -> None:
    system = [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]
    messages = formats.to_messages("anthropic", ANTHROPIC, system=system)
    assert (messages[0].role, messages[0].content) == ("system", "part one\npart two")
    assert messages[0].source_index == -1


def test_anthropic_user_message_split_keeps_source_index() -> None:
    messages = formats.to_messages("anthropic", ANTHROPIC, system=SYSTEM)
    from_third = [m for m in messages if m.source_index == 2]
    assert [m.role for m in from_third] == ["tool", "tool", "user"]
    assert len({m.id for m in messages}) == len(messages)  # internal ids unique


def test_openai_developer_role_and_refusal_parts() -> None:
    raw = [
        {"role": "developer", "content": "rules"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
    ]
    messages = formats.to_messages("openai", raw)
    assert [(m.role, m.content) for m in messages] == [
        ("system", "rules"),
        ("assistant", "I can't."),
    ]


def test_tool_name_resolved_for_every_result() -> None:
    for messages in (
        formats.to_messages("openai", OPENAI),
        formats.to_messages("anthropic", ANTHROPIC, system=SYSTEM),
    ):
        calls = {c.id: c.name for m in messages for c in m.tool_calls}
        results = [m for m in messages if m.role == "tool"]
        assert results
        assert all(m.tool_name == calls[m.tool_call_id or ""] for m in results)


@pytest.mark.parametrize(
    ("fmt", "raw"),
    [
        ("openai", OPENAI),
        ("anthropic", ANTHROPIC),
    ],
)
def test_pending_tool_call_at_the_end_is_valid(fmt: WireFormat, raw: list[dict[str, Any]]) -> None:
    messages = formats.to_messages(fmt, raw)
    last = messages[-1]
    assert last.role == "assistant"
    assert [c.id for c in last.tool_calls] == ["call_3"]
    assert not any(m.tool_call_id == "call_3" for m in messages)


# --- ids ----------------------------------------------------------------------------------------


def test_derived_ids_are_stable() -> None:
    first = formats.source_ids(OPENAI)
    again = formats.source_ids(copy.deepcopy(OPENAI))
    reordered_keys = [dict(reversed(list(m.items()))) for m in OPENAI]
    assert first == again == formats.source_ids(reordered_keys)
    assert len(set(first)) == len(first)
    # Appending messages leaves the earlier ids as they were (the agent's list keeps growing).
    grown = [*OPENAI, {"role": "user", "content": "more"}]
    assert formats.source_ids(grown)[: len(OPENAI)] == first


def test_derived_ids_differ_by_position_and_content() -> None:
    same = {"role": "user", "content": "again"}
    ids = formats.source_ids([same, dict(same), {"role": "user", "content": "again!"}])
    assert len(set(ids)) == 3
    other = formats.source_ids([{"role": "user", "content": "different"}])
    assert other[0] != ids[0]


def test_explicit_ids_are_kept() -> None:
    raw = [
        {"id": "sys-1", "role": "system", "content": "s"},
        {"role": "user", "content": "no id here"},
        {"id": "u:2", "role": "user", "content": "u"},
    ]
    ids = formats.source_ids(raw)
    assert ids[0] == "sys-1"
    assert ids[2] == "u:2"
    assert ids[1] not in ("sys-1", "u:2")
    messages = formats.to_messages("openai", raw)
    assert [m.id for m in messages] == ids


def test_anthropic_ids_derive_from_the_wire_message() -> None:
    raw = [{**m, "id": f"a{i}"} for i, m in enumerate(ANTHROPIC)]
    messages = formats.to_messages("anthropic", raw)
    assert [m.id for m in messages if m.source_index == 0] == ["a0"]
    assert all(m.id.startswith("a2") for m in messages if m.source_index == 2)


# --- rejections ---------------------------------------------------------------------------------


def call(cid: str, name: str = "grep") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}
        ],
    }


def result(cid: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": "out"}


def a_call(cid: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": cid, "name": "grep", "input": {}}],
    }


def a_result(*cids: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": cid, "content": "out"} for cid in cids],
    }


USER = {"role": "user", "content": "hi"}

REJECTED: dict[str, tuple[WireFormat, list[Any], str]] = {
    "openai-unknown-role": ("openai", [USER, {"role": "bot", "content": "x"}], "messages[1].role"),
    "openai-function-role": (
        "openai",
        [{"role": "function", "name": "f", "content": "x"}],  # answers no function_call
        "messages[0].name",
    ),
    "openai-missing-role": ("openai", [{"content": "x"}], "messages[0].role"),
    "anthropic-system-role-in-messages": (
        "anthropic",
        [{"role": "system", "content": "x"}],
        "messages[0].role",
    ),
    "anthropic-tool-role": ("anthropic", [{"role": "tool", "content": "x"}], "messages[0].role"),
    "openai-result-without-call": ("openai", [USER, result("call_9")], "messages[1]"),
    "anthropic-result-without-call": ("anthropic", [USER, a_result("toolu_9")], "messages[1]"),
    "openai-result-before-call": ("openai", [USER, result("c1"), call("c1")], "messages[1]"),
    "anthropic-result-before-call": (
        "anthropic",
        [USER, a_result("t1"), a_call("t1")],
        "messages[1]",
    ),
    "openai-second-result": (
        "openai",
        [USER, call("c1"), result("c1"), result("c1")],
        "messages[3]",
    ),
    "anthropic-second-result-same-message": (
        "anthropic",
        [USER, a_call("t1"), a_result("t1", "t1")],
        "messages[2]",
    ),
    "openai-duplicate-call-id-across-messages": (
        "openai",
        [USER, call("c1"), result("c1"), call("c1")],
        "messages[3]",
    ),
    "openai-duplicate-call-id-in-one-message": (
        "openai",
        [
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("c1")["tool_calls"][0], call("c1", "ls")["tool_calls"][0]],
            },
        ],
        "messages[1]",
    ),
    "anthropic-duplicate-call-id": (
        "anthropic",
        [USER, a_call("t1"), a_result("t1"), a_call("t1")],
        "messages[3]",
    ),
    "openai-duplicate-message-id": (
        "openai",
        [{**USER, "id": "x"}, {**USER, "id": "x", "content": "again"}],
        "messages[1].id",
    ),
    "anthropic-duplicate-message-id": (
        "anthropic",
        [{**USER, "id": "x"}, {"role": "assistant", "content": "a", "id": "x"}],
        "messages[1].id",
    ),
    "openai-non-string-id": ("openai", [{**USER, "id": 7}], "messages[0].id"),
    "openai-empty-id": ("openai", [{**USER, "id": ""}], "messages[0].id"),
    "openai-tool-without-call-id": (
        "openai",
        [USER, call("c1"), {"role": "tool", "content": "x"}],
        "messages[2].tool_call_id",
    ),
    "openai-user-with-tool-calls": (
        "openai",
        [{**USER, "tool_calls": call("c1")["tool_calls"]}],
        "messages[0].tool_calls",
    ),
    "openai-call-without-function": (
        "openai",
        [USER, {"role": "assistant", "tool_calls": [{"id": "c1"}]}],
        "messages[1].tool_calls[0].function",
    ),
    "openai-call-without-name": (
        "openai",
        [
            USER,
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]},
        ],
        "messages[1].tool_calls[0].function.name",
    ),
    "openai-call-without-id": (
        "openai",
        [
            USER,
            {"role": "assistant", "tool_calls": [{"function": {"name": "g", "arguments": "{}"}}]},
        ],
        "messages[1].tool_calls[0].id",
    ),
    "openai-object-arguments": (
        "openai",
        [
            USER,
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "function": {"name": "g", "arguments": {"a": 1}}}],
            },
        ],
        "messages[1].tool_calls[0].function.arguments",
    ),
    "openai-content-object": (
        "openai",
        [{"role": "user", "content": {"a": 1}}],
        "messages[0].content",
    ),
    "openai-part-without-type": (
        "openai",
        [{"role": "user", "content": [{"text": "x"}]}],
        "messages[0].content[0]",
    ),
    "openai-text-part-without-text": (
        "openai",
        [{"role": "user", "content": [{"type": "text"}]}],
        "messages[0].content[0].text",
    ),
    "openai-anthropic-tool-use-block": (
        "openai",
        [
            USER,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "g", "input": {}}],
            },
        ],
        "messages[1].content[0].type",
    ),
    "openai-anthropic-tool-result-block": (
        "openai",
        [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "big output"}],
            }
        ],
        "messages[0].content[0].type",
    ),
    "openai-message-not-object": ("openai", [USER, "hello"], "messages[1]"),
    "openai-top-level-system": ("openai", [USER], "system"),
    "anthropic-tool-use-in-user": (
        "anthropic",
        [{"role": "user", "content": a_call("t1")["content"]}],
        "messages[0].content[0].type",
    ),
    "anthropic-tool-use-without-name": (
        "anthropic",
        [USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}],
        "messages[1].content[0].name",
    ),
    "anthropic-result-without-id": (
        "anthropic",
        [USER, {"role": "user", "content": [{"type": "tool_result"}]}],
        "messages[1].content[0].tool_use_id",
    ),
    "anthropic-null-content": (
        "anthropic",
        [{"role": "assistant", "content": None}],
        "messages[0].content",
    ),
    "anthropic-thinking-not-string": (
        "anthropic",
        [{"role": "assistant", "content": [{"type": "thinking", "thinking": 3}]}],
        "messages[0].content[0].thinking",
    ),
}


@pytest.mark.parametrize(("fmt", "raw", "field"), REJECTED.values(), ids=REJECTED.keys())
def test_rejected_with_field_and_reason(fmt: WireFormat, raw: list[Any], field: str) -> None:
    system = "s" if field == "system" else None
    with pytest.raises(InvalidSnapshot) as info:
        formats.to_messages(fmt, raw, system=system)
    assert info.value.field == field
    assert info.value.reason
    assert info.value.to_dict() == {
        "error": "invalid_snapshot",
        "field": field,
        "reason": info.value.reason,
    }


def test_pairing_reasons_say_why() -> None:
    reasons = {}
    for key in (
        "openai-result-without-call",
        "openai-second-result",
        "openai-duplicate-call-id-across-messages",
        "openai-duplicate-message-id",
    ):
        fmt, raw, _ = REJECTED[key]
        with pytest.raises(InvalidSnapshot) as info:
            formats.to_messages(fmt, raw)
        reasons[key] = info.value.reason
    assert "no earlier tool call" in reasons["openai-result-without-call"]
    assert "second result" in reasons["openai-second-result"]
    assert "duplicate tool call id" in reasons["openai-duplicate-call-id-across-messages"]
    assert "duplicate message id" in reasons["openai-duplicate-message-id"]


# --- rendering (replacements are written back in the agent's format) ----------------------------


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_render_round_trips(fmt: WireFormat) -> None:
    raw = OPENAI if fmt == "openai" else ANTHROPIC
    system = None if fmt == "openai" else SYSTEM
    messages = formats.to_messages(fmt, raw, system=system)
    body = [m for m in messages if m.role != "system"] if fmt == "anthropic" else messages
    rendered = formats.render(fmt, body, with_ids=False)
    again = formats.to_messages(fmt, rendered, system=system)
    drop_reasoning = [(*s[:2], "", *s[3:]) for s in shape(again)]
    assert drop_reasoning == [(*s[:2], "", *s[3:]) for s in EXPECTED_SHAPE]


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_replace_tool_results_changes_only_those_bodies(fmt: WireFormat) -> None:
    raw = OPENAI if fmt == "openai" else ANTHROPIC
    before = copy.deepcopy(raw)
    edited = formats.replace_tool_results(fmt, raw, {"call_1": "[Previous: used grep]"})
    assert raw == before  # pure
    messages = formats.to_messages(fmt, edited, system=SYSTEM if fmt == "anthropic" else None)
    bodies = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    assert bodies == {"call_1": "[Previous: used grep]", "call_2": "ok"}
