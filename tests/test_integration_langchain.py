"""The LangChain adapter: lossless message conversion (a property), and the real
``create_agent`` loop and LangGraph's prebuilt agent compacting in the background against a real
Redis and real worker processes, with a scripted chat model."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from worker import formats
from worker.integrations.langchain import EXTENSION, from_wire, to_wire

# --- conversion: messages -> wire -> messages is the identity -----------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=3)
words = st.text(max_size=40)
urls = st.sampled_from(["https://example.com/a.png", "http://x/y.jpg?size=2"])
base64_data = st.sampled_from(["iVBORw0KGgo=", "R0lGODlhAQABAAAAACw=", ""])

blocks = st.one_of(
    words,  # a bare string in a content list
    st.builds(lambda t: {"type": "text", "text": t}, words),
    st.builds(lambda t, i: {"type": "text", "text": t, "id": i, "annotations": []}, words, words),
    st.builds(lambda u: {"type": "image", "url": u}, urls),
    st.builds(
        lambda b, m: {"type": "image", "base64": b, "mime_type": m},
        base64_data,
        st.sampled_from(["image/png", "image/gif"]),
    ),
    st.builds(lambda b: {"type": "image", "base64": b}, base64_data),  # no mime type
    st.builds(lambda b: {"type": "image", "file_id": b}, words),
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u, "detail": "high"}}, urls),
    st.builds(lambda u: {"type": "file", "url": u, "mime_type": "application/pdf"}, urls),
    st.builds(lambda t: {"type": "reasoning", "reasoning": t, "id": "rs_1"}, words),
    st.builds(lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, words, words),
    st.builds(
        lambda a: {"type": "tool_call", "id": "tc_x", "name": "bash", "args": a}, json_objects
    ),
    st.builds(lambda v: {"type": "x-provider", "data": v}, json_values),
    st.builds(lambda t: {"type": "text", "text": t, EXTENSION: {"str": True}}, words),
    st.builds(lambda v: {"no_type": v}, json_values),
)
contents = words | st.lists(blocks, max_size=4)
names = st.none() | st.sampled_from(["alice", "bash"])


@st.composite
def conversations(draw: Any) -> list[BaseMessage]:
    """System, human, AI and tool messages; each tool result answers a call before it (so the
    worker's own validation accepts the wire form); ids unique or absent."""
    counter = iter(range(10_000))

    def new_id() -> str | None:
        return draw(st.none() | st.just(f"m-{next(counter)}"))

    out: list[BaseMessage] = []
    for kind in draw(st.lists(st.sampled_from(["system", "human", "ai", "tools"]), max_size=6)):
        common = {
            "content": draw(contents),
            "id": new_id(),
            "name": draw(names),
            "additional_kwargs": draw(json_objects),
            "response_metadata": draw(json_objects),
        }
        if kind == "system":
            out.append(SystemMessage(**common))
        elif kind == "human":
            out.append(HumanMessage(**common))
        elif kind == "ai":
            out.append(
                AIMessage(
                    **common,
                    usage_metadata=draw(
                        st.none()
                        | st.builds(
                            lambda i, o: {
                                "input_tokens": i,
                                "output_tokens": o,
                                "total_tokens": i + o,
                            },
                            st.integers(0, 9999),
                            st.integers(0, 9999),
                        )
                    ),
                    invalid_tool_calls=draw(
                        st.lists(
                            st.builds(
                                lambda a: {
                                    "name": "bash",
                                    "args": a,
                                    "id": None,
                                    "error": "bad JSON",
                                    "type": "invalid_tool_call",
                                },
                                words,
                            ),
                            max_size=1,
                        )
                    ),
                )
            )
        else:
            calls = [
                {"name": draw(st.sampled_from(["bash", "read"])), "args": draw(json_objects)}
                | {"id": f"call-{next(counter)}"}
                for _ in range(draw(st.integers(1, 3)))
            ]
            out.append(AIMessage(**common, tool_calls=calls))
            for call in calls:
                out.append(
                    ToolMessage(
                        content=draw(contents),
                        tool_call_id=call["id"],
                        id=new_id(),
                        name=draw(st.none() | st.just(call["name"])),
                        status=draw(st.sampled_from(["success", "error"])),
                        artifact=draw(st.none() | json_values),
                    )
                )
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_messages_to_wire_and_back_is_the_identity(messages: list[BaseMessage]) -> None:
    wire = to_wire(messages)
    assert from_wire(wire) == messages
    # through JSON, as a snapshot and a compaction's messages travel
    assert from_wire(json.loads(json.dumps(wire))) == messages
    # a message's id is its wire id; messages without one get the service's derived id
    assert [w.get("id") for w in wire] == [m.id for m in messages]
    ids = formats.source_ids(wire)
    assert [i for i, m in zip(ids, messages, strict=True) if m.id] == [
        m.id for m in messages if m.id
    ]
    # the worker accepts the wire form, and counts the text it carries
    normalized = formats.to_messages("openai", wire)
    assert len(normalized) == len(messages)
    for m, n in zip(messages, normalized, strict=True):
        assert n.role == {"system": "system", "human": "user", "ai": "assistant"}.get(
            m.type, "tool"
        )
        if isinstance(m, AIMessage):
            assert [c.id for c in n.tool_calls] == [c["id"] for c in m.tool_calls]


def test_the_wire_form_is_chat_completions() -> None:
    messages = [
        SystemMessage("Be brief.", id="s"),
        HumanMessage(
            [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"},
            ],
            id="h",
        ),
        AIMessage("", tool_calls=[{"name": "look", "args": {"x": 1}, "id": "c1"}], id="a"),
        ToolMessage("a cat", tool_call_id="c1", id="t"),
    ]
    wire = to_wire(messages)
    assert wire[0] == {"id": "s", "role": "system", "content": "Be brief."}
    assert wire[1]["content"][0] == {"type": "text", "text": "What is in this image?"}
    image = wire[1]["content"][1]
    assert image["type"] == "image_url"
    assert image["image_url"] == {"url": "data:image/png;base64,iVBORw0KGgo="}
    assert wire[2] == {
        "id": "a",
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"x": 1}'}}
        ],
    }
    assert wire[3] == {"id": "t", "role": "tool", "content": "a cat", "tool_call_id": "c1"}
    # what the worker writes (a summary; a message rendered without the extension) reads too
    summary = {"id": "cws-1", "role": "user", "content": "[compaction-worker summary] ..."}
    assert from_wire([summary]) == [HumanMessage("[compaction-worker summary] ...", id="cws-1")]
    rendered = {
        "id": "a",
        "role": "assistant",
        "content": None,
        "tool_calls": wire[2]["tool_calls"],
    }
    assert from_wire([rendered]) == [messages[2]]
