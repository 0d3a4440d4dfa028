"""Every type the installed ``openai`` SDK can send, in both OpenAI formats (issue: "Chat
Completions and Responses accept every type the SDK can send, keep what is opaque intact, and
treat a Responses compaction item as the provider's boundary").

The histories are built from the SDK's own TypedDicts, their opaque fields (encrypted content,
inline data, the ids of objects on OpenAI's side, credentials) filled with distinctive markers.
For each format: every type is accepted; the normalized text holds the readable parts and no
marker; an unchanged message or item renders back exactly; a compaction (in process, the offline
digest) leaves every marker either in a part or item identical to the one it came in, or gone
with the whole of it, and puts none in its summary or anywhere else in its event. A Responses
``compaction`` item is the provider's boundary: nothing before it is counted or compacted.
"""

from __future__ import annotations

import json
import logging
import math
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types import chat
from openai.types.chat import chat_completion_assistant_message_param as assistant_param
from openai.types.chat import chat_completion_content_part_param as part_param
from openai.types.responses import (
    EasyInputMessageParam,
    ResponseCodeInterpreterToolCallParam,
    ResponseCompactionItemParamParam,
    ResponseComputerToolCallParam,
    ResponseConfigurationUpdateItemParamParam,
    ResponseCustomToolCallOutputParam,
    ResponseCustomToolCallParam,
    ResponseFileSearchToolCallParam,
    ResponseFunctionToolCallParam,
    ResponseFunctionWebSearchParam,
    ResponseInputFileParam,
    ResponseInputImageParam,
    ResponseInputItemParam,
    ResponseInputTextParam,
    ResponseOutputMessageParam,
    ResponseOutputRefusalParam,
    ResponseOutputTextParam,
    ResponseReasoningItemParam,
    ResponseToolSearchOutputItemParamParam,
)
from openai.types.responses import response_input_item_param as item_param

from worker.config import Settings
from worker.core.planning import STRIPPED_ARGUMENTS, STRIPPED_RESPONSE
from worker.errors import InvalidSnapshot
from worker.pipeline import Adapters, Pipeline, tokens_of
from worker.tokens import tokenizer_for
from worker.transcripts.filesystem import FileStore
from worker.wire import formats
from worker.wire.events import CompactionEvent, CompletedEvent, Trigger
from worker.wire.formats import openai as chat_format
from worker.wire.formats import responses as responses_format
from worker.wire.history import apply_compaction
from worker.wire.media import OPAQUE_CHARS_PER_TOKEN
from worker.wire.models import Message, canonical_json
from worker.wire.snapshots import parse_snapshot

TOKENIZER = tokenizer_for("gpt-4.1")


# --- the SDK's types, and the formats' sets of what they know -------------------------------------


def _literals(annotation: Any) -> set[str]:
    """The string literals an annotation allows (through Required, Optional, Union, ...)."""
    if typing.get_origin(annotation) is typing.Literal:
        return {a for a in typing.get_args(annotation) if isinstance(a, str)}
    return {lit for arg in typing.get_args(annotation) for lit in _literals(arg)}


def _members_field(union: Any, key: str) -> dict[str, str]:
    """Each literal of ``key`` over the members of a TypedDict union, with the member's name."""
    found: dict[str, str] = {}
    for member in typing.get_args(union):
        hints = typing.get_type_hints(member, include_extras=True)
        for literal in _literals(hints[key]):
            found.setdefault(literal, member.__name__)
    return found


SDK_ROLES = _members_field(chat.ChatCompletionMessageParam, "role")
SDK_PARTS = {
    **_members_field(chat.ChatCompletionContentPartParam, "type"),
    **_members_field(assistant_param.ContentArrayOfContentPart, "type"),
}
SDK_TOOL_CALLS = _members_field(chat.ChatCompletionMessageToolCallUnionParam, "type")
SDK_ITEMS = _members_field(ResponseInputItemParam, "type")
KNOWN = {
    "role": (SDK_ROLES, chat_format.ROLES),
    "part": (SDK_PARTS, chat_format.PART_TYPES),
    "tool call": (SDK_TOOL_CALLS, chat_format.TOOL_CALL_TYPES),
    "item": (SDK_ITEMS, responses_format.ITEM_TYPES),
}


def test_the_sdk_unions_are_read_whole() -> None:
    """The introspection finds every member (so that the tests below cover them all)."""
    assert len(typing.get_args(ResponseInputItemParam)) >= 33
    assert set(SDK_ITEMS.values()) >= {"ShellCallOutput", "ResponseCompactionItemParamParam"}
    assert {"function", "developer"} <= set(SDK_ROLES)
    assert {"custom", "function"} <= set(SDK_TOOL_CALLS)
    assert {"file", "refusal"} <= set(SDK_PARTS)


@pytest.mark.parametrize(
    ("kind", "name"),
    [(kind, name) for kind, (sdk, _) in KNOWN.items() for name in sorted(sdk)],
    ids=lambda value: str(value),
)
def test_every_sdk_type_is_known(kind: str, name: str) -> None:
    sdk, known = KNOWN[kind]
    assert name in known, f"the SDK's {kind} type {name!r} ({sdk[name]}) is unknown to the format"


@pytest.mark.parametrize("kind", sorted(KNOWN))
def test_the_format_knows_no_type_the_sdk_lacks(kind: str) -> None:
    sdk, known = KNOWN[kind]
    assert set(known) - set(sdk) == set()


# --- markers: what is opaque, filled so that a leak shows --------------------------------------


class Markers:
    """Distinctive values for opaque fields. ``ids`` are the ones the service publishes as
    structure (message and call ids: a range's first and last ids, what was dropped): they
    must never reach a summary's text. Every other marker must never leave its part or item."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.opaque: list[str] = []
        self.ids: list[str] = []

    def __call__(self, field: str) -> str:
        value = f"{self.prefix}OPQ{field.replace('_', '')}{len(self.opaque):02d}Z"
        self.opaque.append(value)
        return value

    def id(self, prefix: str) -> str:
        value = f"{prefix}_{self.prefix}ID{len(self.ids):02d}Z"
        self.ids.append(value)
        return value

    def data_url(self, field: str, mime: str = "image/png") -> str:
        return f"data:{mime};base64,{self(field)}"

    @property
    def all(self) -> list[str]:
        return [*self.opaque, *self.ids]


def _texts(messages: list[Message]) -> str:
    """What a summarizer may read of normalized messages: texts, reasoning, calls."""
    return "\n".join(
        part
        for m in messages
        for part in (m.content, m.reasoning, *(f"{c.name} {c.arguments}" for c in m.tool_calls))
    )


def _dicts(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from _dicts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _dicts(v)


def _holding(value: dict[str, Any], marker: str) -> bool:
    return any(isinstance(v, str) and marker in v for v in value.values())


def assert_opaque_intact(
    source: list[dict[str, Any]], applied: list[dict[str, Any]], markers: list[str]
) -> None:
    """Every object of the applied history that holds a marker is, whole, an object of the
    source that holds it: the part, block or item the marker came in, byte for byte, or none.
    (Ids are structure, written into a rewritten call: only opaque markers are checked.)"""
    originals = [canonical_json(d) for d in _dicts(source)]
    for found in _dicts(applied):
        for marker in markers:
            if _holding(found, marker):
                assert canonical_json(found) in originals, (marker, found)


PLACEHOLDER = re.compile(r"\[(?:image|file|opaque) \d+ in message [^\]]+\]")


def assert_nothing_leaked(event: CompactionEvent, markers: Markers) -> None:
    """No marker in the summary (but message ids in its placeholders); no opaque marker
    anywhere in the event outside the items it carries whole."""
    assert isinstance(event, CompletedEvent)
    # A summary names an image or file by the message it is in: ids are structure there.
    text = PLACEHOLDER.sub("", event.compaction.summary.text)
    for marker in markers.all:
        assert marker not in text, marker
    published = event.model_dump(mode="json")
    published["compaction"]["replacement"] = []
    dumped = json.dumps(published)
    for marker in markers.opaque:
        assert marker not in dumped, marker


def assert_not_logged(caplog: pytest.LogCaptureFixture, markers: Markers) -> None:
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    for marker in markers.all:
        assert marker not in logged, marker


def _compact(snap: dict[str, Any], root: Path) -> CompactionEvent:
    parsed = parse_snapshot(snap, Settings())
    return Pipeline(parsed.settings, Adapters(store=FileStore(root))).run(parsed)[-1]


def _trigger(snap: dict[str, Any], root: Path) -> Trigger:
    parsed = parse_snapshot(snap, Settings())
    pipeline = Pipeline(parsed.settings, Adapters(store=FileStore(root)))
    return pipeline.evaluate(parsed).evaluation.trigger()


def _snapshot(fmt: str, messages: list[Any], threshold: int, **extra: Any) -> dict[str, Any]:
    return {
        "conversation_id": f"{fmt}-types",
        "revision": len(messages),
        "model": {"name": "gpt-4.1"},
        "format": fmt,
        "messages": messages,
        "config": {"auto_compact_threshold_tokens": threshold, "summary_max_output_tokens": 400},
        **extra,
    }


LOG = "\n".join(f"tests/test_pricing.py::test_round_{k} PASSED" for k in range(60))


# --- Chat Completions -------------------------------------------------------------------------


def chat_history(mark: Markers) -> list[Any]:
    """Every role, content part and tool-call type of the SDK, in one coding session."""
    return [
        chat.ChatCompletionSystemMessageParam(
            role="system",
            name="harness",
            content=[chat.ChatCompletionContentPartTextParam(type="text", text="You code.")],
        ),
        chat.ChatCompletionDeveloperMessageParam(
            role="developer", content="Prefer small patches to src/pricing.py."
        ),
        chat.ChatCompletionUserMessageParam(
            role="user",
            name="ana",
            content=[
                chat.ChatCompletionContentPartTextParam(
                    type="text", text="Fix the rounding of totals in src/pricing.py."
                ),
                chat.ChatCompletionContentPartImageParam(
                    type="image_url",
                    image_url={"url": mark.data_url("imageurl"), "detail": "low"},
                ),
                chat.ChatCompletionContentPartInputAudioParam(
                    type="input_audio", input_audio={"data": mark("data"), "format": "wav"}
                ),
                part_param.File(
                    type="file",
                    file={
                        "file_data": mark.data_url("filedata", "application/pdf"),
                        "file_id": mark("fileid"),
                        "filename": "invoice-2024.pdf",
                    },
                ),
            ],
        ),
        chat.ChatCompletionAssistantMessageParam(
            role="assistant",
            name="coder",
            audio={"id": mark("audioid")},
            content=[
                chat.ChatCompletionContentPartTextParam(type="text", text="Reading the parser."),
                chat.ChatCompletionContentPartRefusalParam(
                    type="refusal", refusal="I will not print PRICING_API_KEY."
                ),
            ],
            refusal="Secrets stay hidden.",
            tool_calls=[
                chat.ChatCompletionMessageFunctionToolCallParam(
                    id=mark.id("call"),
                    type="function",
                    function={"name": "grep", "arguments": '{"pattern": "round_total("}'},
                ),
                chat.ChatCompletionMessageCustomToolCallParam(
                    id=mark.id("call"),
                    type="custom",
                    custom={
                        "name": "apply_patch",
                        "input": "*** Begin Patch\n*** Update File: src/pricing.py\n"
                        "-    return round(x)\n+    return round_half_even(x, 2)\n*** End Patch",
                    },
                ),
            ],
        ),
        chat.ChatCompletionToolMessageParam(
            role="tool", tool_call_id=mark.ids[0], content="src/pricing.py:12: def round_total("
        ),
        chat.ChatCompletionToolMessageParam(
            role="tool",
            tool_call_id=mark.ids[1],
            content=[chat.ChatCompletionContentPartTextParam(type="text", text="Patched.\n" + LOG)],
        ),
        chat.ChatCompletionAssistantMessageParam(
            role="assistant",
            content=None,
            function_call={"name": "run_tests", "arguments": '{"path": "tests/test_pricing.py"}'},
        ),
        chat.ChatCompletionFunctionMessageParam(role="function", name="run_tests", content=LOG),
        chat.ChatCompletionUserMessageParam(role="user", content="Now update CHANGELOG.md."),
        chat.ChatCompletionAssistantMessageParam(role="assistant", content="Updating it."),
    ]


def test_every_chat_type_is_read_for_its_readable_parts() -> None:
    mark = Markers("c")
    history = chat_history(mark)
    messages = formats.to_messages("openai", history)
    ids = formats.source_ids(history)
    assert [m.role for m in messages] == [
        "system", "system", "user", "assistant", "tool", "tool", "assistant", "tool", "user",
        "assistant",
    ]  # fmt: skip
    user, assistant = messages[2], messages[3]
    assert user.content == "Fix the rounding of totals in src/pricing.py."
    assert [a.kind for a in user.attachments] == ["image", "file"]
    assert user.attachments[1].label == "invoice-2024.pdf"
    assert assistant.content == (
        "Reading the parser.\nI will not print PRICING_API_KEY.\nSecrets stay hidden."
    )
    custom = assistant.tool_calls[1]
    assert (custom.id, custom.name) == (mark.ids[1], "apply_patch")
    assert custom.arguments.startswith("*** Begin Patch")
    assert (messages[5].tool_call_id, messages[5].tool_name) == (mark.ids[1], "apply_patch")
    # The deprecated function_call pairs with the function message of its name.
    (call,) = messages[6].tool_calls
    assert (call.id, call.name) == (chat_format.function_call_id(ids[6]), "run_tests")
    assert (messages[7].tool_call_id, messages[7].tool_name) == (call.id, "run_tests")
    assert all(m.unknown_types == () for m in messages)
    text = _texts(messages)
    for marker in mark.all:
        assert marker not in text


def test_unchanged_chat_messages_render_as_they_came() -> None:
    history = chat_history(Markers("r"))
    messages = formats.to_messages("openai", history)
    assert formats.render("openai", messages, with_ids=False, source=history) == history
    ids = formats.source_ids(history)
    with_ids = formats.render("openai", messages, with_ids=True, source=history)
    assert with_ids == [{"id": i, **m} for i, m in zip(ids, history, strict=True)]


def test_chat_parts_and_calls_of_unknown_types_are_carried_and_counted(tmp_path: Path) -> None:
    video = {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}, "n": 1}
    mcp = {"type": "mcp", "id": "call_mcp", "mcp": {"server": "docs", "query": "rounding"}}
    history: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "Watch this."}, video]},
        {"role": "assistant", "content": None, "tool_calls": [mcp]},
        {"role": "tool", "tool_call_id": "call_mcp", "content": "found 3 pages"},
    ]
    messages = formats.to_messages("openai", history)
    assert messages[0].content == "Watch this."
    assert messages[0].unknown_types == ("video_url",)
    (payload,) = messages[0].attachments
    assert payload.kind == "opaque"
    assert payload.tokens == math.ceil(len(canonical_json(video)) / OPAQUE_CHARS_PER_TOKEN)
    assert "example.com" not in payload.label
    assert messages[1].unknown_types == ("mcp",)
    assert [(c.id, c.name, c.arguments) for c in messages[1].tool_calls] == [
        ("call_mcp", "mcp", "")
    ]
    assert "rounding" not in _texts(messages)
    assert (messages[2].tool_call_id, messages[2].tool_name) == ("call_mcp", "mcp")
    assert formats.render("openai", messages, with_ids=False, source=history) == history
    trigger = _trigger(_snapshot("openai", history, 100_000), tmp_path)
    assert trigger.unknown_types == {"mcp": 1, "video_url": 1}
    assert trigger.counted_by == "tiktoken+opaque-estimate"


CHAT_REJECTED: dict[str, tuple[list[Any], str, str]] = {
    "custom without custom": (
        [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom"}]}],
        "messages[0].tool_calls[0].custom",
        "custom object",
    ),
    "custom without input": (
        [{"role": "assistant",
          "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "p"}}]}],
        "messages[0].tool_calls[0].custom.input",
        "string",
    ),
    "custom without name": (
        [{"role": "assistant",
          "tool_calls": [{"id": "c", "type": "custom", "custom": {"input": "x"}}]}],
        "messages[0].tool_calls[0].custom.name",
        "non-empty",
    ),
    "function_call not an object": (
        [{"role": "assistant", "function_call": "run"}],
        "messages[0].function_call",
        "object",
    ),
    "function_call without name": (
        [{"role": "assistant", "function_call": {"arguments": "{}"}}],
        "messages[0].function_call.name",
        "non-empty",
    ),
    "function message without a call": (
        [{"role": "function", "name": "run_tests", "content": "ok"}],
        "messages[0].name",
        "no earlier function_call named 'run_tests'",
    ),
    "function message without name": (
        [{"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
         {"role": "function", "content": "ok"}],
        "messages[1].name",
        "non-empty",
    ),
    "user with a function_call": (
        [{"role": "user", "content": "x", "function_call": {"name": "f", "arguments": "{}"}}],
        "messages[0].function_call",
        "cannot call tools",
    ),
    "refusal not text": (
        [{"role": "assistant", "content": None, "refusal": 3}],
        "messages[0].refusal",
        "string",
    ),
    "tool call type not text": (
        [{"role": "assistant", "tool_calls": [{"id": "c", "type": 1}]}],
        "messages[0].tool_calls[0].type",
        "string",
    ),
    "anthropic tool_use part": (
        [{"role": "assistant",
          "content": [{"type": "tool_use", "id": "t", "name": "g", "input": {}}]}],
        "messages[0].content[0].type",
        "anthropic",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CHAT_REJECTED))
def test_bad_chat_messages_name_the_field(case: str) -> None:
    history, field, reason = CHAT_REJECTED[case]
    with pytest.raises(InvalidSnapshot) as info:
        formats.to_messages("openai", history)
    assert info.value.field == field
    assert reason in info.value.reason


def _chat_filler(turns: int) -> list[Any]:
    out: list[Any] = []
    for k in range(turns):
        out += [
            {"role": "user", "content": f"Check module {k} for rounding."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_read_{k}", "type": "function",
                 "function": {"name": "read_file", "arguments": f'{{"path": "src/m{k}.py"}}'}}]},
            {"role": "tool", "tool_call_id": f"call_read_{k}", "content": LOG},
        ]  # fmt: skip
    return out


def test_a_chat_compaction_keeps_opaque_parts_whole_and_out_of_the_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mark = Markers("k")
    caplog.set_level(logging.DEBUG)
    typed = chat_history(mark)
    history = [*typed[:-2], *_chat_filler(4), *typed[-2:]]
    event = _compact(_snapshot("openai", history, 600), tmp_path)
    assert event.type == "compaction.completed", event
    assert isinstance(event, CompletedEvent)
    assert event.compaction.start == 2  # the system and developer messages stay
    assert event.trigger.unknown_types == {}
    applied = apply_compaction(history, event)
    assert_opaque_intact(history, applied, mark.opaque)
    assert_nothing_leaked(event, mark)
    # The user turn with its image, audio and file is carried whole, not summarized.
    assert history[2] in applied
    assert_not_logged(caplog, mark)


def test_custom_and_deprecated_function_calls_strip_and_stay_paired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mark = Markers("s")
    caplog.set_level(logging.DEBUG)
    typed = chat_history(mark)
    history = [*typed[:-2], *_chat_filler(4), *typed[-2:]]
    tools = {
        "apply_patch": {"compaction": "strip"},
        "run_tests": {"compaction": "strip-responses"},
    }
    event = _compact(_snapshot("openai", history, 600, tools=tools), tmp_path)
    assert isinstance(event, CompletedEvent), event
    carried = event.compaction.replacement[:-1]
    (patch,) = [m for m in carried if m["role"] == "assistant" and m.get("tool_calls")]
    # Rewritten: only the stripped custom call, written as a custom call; the audio response
    # and the participant's name it cannot rebuild are kept as they were.
    assert patch["tool_calls"] == [
        {"id": mark.ids[1], "type": "custom",
         "custom": {"name": "apply_patch", "input": STRIPPED_ARGUMENTS}}
    ]  # fmt: skip
    assert patch["audio"] == history[3]["audio"] and patch["name"] == "coder"
    assert "refusal" not in patch and patch["content"] is None
    (patched,) = [m for m in carried if m.get("tool_call_id") == mark.ids[1]]
    assert patched == {"role": "tool", "tool_call_id": mark.ids[1], "content": STRIPPED_RESPONSE}
    # The deprecated call is carried as it was, its function message stripped.
    assert history[6] in carried
    (function,) = [m for m in carried if m["role"] == "function"]
    assert function == {"role": "function", "name": "run_tests", "content": STRIPPED_RESPONSE}
    applied = apply_compaction(history, event)
    again = formats.to_messages("openai", applied)  # still valid, every result paired
    assert {m.tool_call_id for m in again if m.role == "tool"} >= {mark.ids[1]}
    assert_opaque_intact(history, applied, mark.opaque)
    assert_nothing_leaked(event, mark)
    assert_not_logged(caplog, mark)


def test_a_rewritten_function_call_stays_a_function_call() -> None:
    history = chat_history(Markers("f"))
    messages = formats.to_messages("openai", history)
    call = messages[6].tool_calls[0].model_copy(update={"arguments": STRIPPED_ARGUMENTS})
    stripped = messages[6].model_copy(update={"tool_calls": (call,)})
    answer = messages[7].model_copy(update={"content": STRIPPED_RESPONSE})
    rendered = formats.render("openai", [stripped, answer], with_ids=False, source=history)
    assert rendered == [
        {"role": "assistant", "content": None,
         "function_call": {"name": "run_tests", "arguments": STRIPPED_ARGUMENTS}},
        {"role": "function", "name": "run_tests", "content": STRIPPED_RESPONSE},
    ]  # fmt: skip
    projected = formats.replace_tool_results("openai", history, {call.id: "[elided]"})
    assert projected[7] == {**history[7], "content": "[elided]"}
    assert [p for i, p in enumerate(projected) if i != 7] == [
        h for i, h in enumerate(history) if i != 7
    ]


# --- Responses --------------------------------------------------------------------------------


def responses_items(mark: Markers) -> list[Any]:
    """Every member of ``ResponseInputItemParam`` but the compaction (a boundary: its own test),
    in one agent run."""
    fc, custom, cu, lsh, sh, ap, ts, prog = (mark.id("call") for _ in range(8))
    approval = mark.id("mcpr")
    return [
        item_param.Message(
            type="message",
            role="developer",
            content=[ResponseInputTextParam(type="input_text", text="Work in src/ only.")],
        ),
        EasyInputMessageParam(
            role="user",
            content=[
                ResponseInputTextParam(type="input_text", text="Totals round wrong; fix them."),
                ResponseInputImageParam(
                    type="input_image",
                    detail="low",
                    image_url=mark.data_url("imageurl"),
                    file_id=mark("fileid"),
                ),
                ResponseInputFileParam(
                    type="input_file",
                    filename="invoice-2024.pdf",
                    file_data=mark.data_url("filedata", "application/pdf"),
                    file_id=mark("fileid"),
                ),
            ],
        ),
        ResponseReasoningItemParam(
            type="reasoning",
            id=mark.id("rs"),
            summary=[{"type": "summary_text", "text": "Find where totals are rounded."}],
            content=[{"type": "reasoning_text", "text": "round() uses banker's rounding"}],
            encrypted_content=mark("encryptedcontent"),
        ),
        ResponseFunctionToolCallParam(
            type="function_call",
            id=mark.id("fc"),
            call_id=fc,
            name="grep",
            arguments='{"pattern": "round_total("}',
            namespace="repo",
            status="completed",
        ),
        item_param.FunctionCallOutput(
            type="function_call_output",
            call_id=fc,
            output=[
                {"type": "input_text", "text": "src/pricing.py:12: def round_total("},
                {"type": "input_image", "image_url": mark.data_url("imageurl"), "detail": "low"},
            ],
        ),
        ResponseCustomToolCallParam(
            type="custom_tool_call",
            call_id=custom,
            name="apply_patch",
            input="*** Begin Patch\n*** Update File: src/pricing.py\n*** End Patch",
        ),
        ResponseCustomToolCallOutputParam(
            type="custom_tool_call_output", call_id=custom, output="Patched src/pricing.py."
        ),
        ResponseComputerToolCallParam(
            type="computer_call",
            id=mark.id("cu"),
            call_id=cu,
            action={"type": "click", "button": "left", "x": 10, "y": 20},
            pending_safety_checks=[
                {"id": mark("safetyid"), "code": "malicious_instructions", "message": "careful"}
            ],
            status="completed",
        ),
        item_param.ComputerCallOutput(
            type="computer_call_output",
            call_id=cu,
            output={"type": "computer_screenshot", "image_url": mark.data_url("imageurl")},
            acknowledged_safety_checks=[{"id": mark("safetyid"), "code": "malicious_instructions"}],
        ),
        item_param.LocalShellCall(
            type="local_shell_call",
            id=mark.id("lsh"),
            call_id=lsh,
            action={"type": "exec", "command": ["pytest", "-q"], "env": {"CI": "1"}},
            status="completed",
        ),
        item_param.LocalShellCallOutput(type="local_shell_call_output", id=lsh, output=LOG),
        item_param.ShellCall(
            type="shell_call",
            call_id=sh,
            action={"commands": ["git diff --stat"], "timeout_ms": 1000},
            status="completed",
        ),
        item_param.ShellCallOutput(
            type="shell_call_output",
            call_id=sh,
            output=[
                {
                    "stdout": " src/pricing.py | 2 +-",
                    "stderr": "warning: CRLF",
                    "outcome": {"type": "exit", "exit_code": 0},
                },
                {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}},
            ],
        ),
        item_param.ApplyPatchCall(
            type="apply_patch_call",
            call_id=ap,
            operation={"type": "update_file", "path": "CHANGELOG.md", "diff": "+- Fix rounding"},
            status="completed",
        ),
        item_param.ApplyPatchCallOutput(
            type="apply_patch_call_output", call_id=ap, status="completed", output="applied"
        ),
        ResponseFunctionWebSearchParam(
            type="web_search_call",
            id=mark.id("ws"),
            action={"type": "search", "query": "python round half even decimal"},
            status="completed",
        ),
        ResponseFileSearchToolCallParam(
            type="file_search_call",
            id=mark.id("fs"),
            queries=["rounding policy"],
            status="completed",
            results=[
                {
                    "file_id": mark("fileid"),
                    "filename": "policy.md",
                    "score": 0.9,
                    "text": "Round half to even.",
                }
            ],
        ),
        item_param.ImageGenerationCall(
            type="image_generation_call",
            id=mark.id("ig"),
            result=mark("result"),
            status="completed",
            output_format="png",
            revised_prompt="a rounding chart",
        ),
        ResponseCodeInterpreterToolCallParam(
            type="code_interpreter_call",
            id=mark.id("ci"),
            code="print(round(2.5))",
            container_id=mark("containerid"),
            outputs=[{"type": "logs", "logs": "2"}],
            status="completed",
        ),
        item_param.McpListTools(
            type="mcp_list_tools",
            id=mark.id("mcpl"),
            server_label="docs",
            tools=[
                {
                    "name": "search_docs",
                    "input_schema": {"type": "object"},
                    "description": "Search the docs.",
                }
            ],
        ),
        item_param.McpApprovalRequest(
            type="mcp_approval_request",
            id=approval,
            name="search_docs",
            arguments='{"q": "rounding"}',
            server_label="docs",
        ),
        item_param.McpApprovalResponse(
            type="mcp_approval_response",
            approval_request_id=approval,
            approve=True,
            reason="read-only search",
        ),
        item_param.McpCall(
            type="mcp_call",
            id=mark.id("mcp"),
            name="search_docs",
            arguments='{"q": "rounding"}',
            server_label="docs",
            approval_request_id=approval,
            output="Rounding: half to even.",
            status="completed",
        ),
        item_param.ToolSearchCall(
            type="tool_search_call",
            call_id=ts,
            arguments={"query": "changelog tools"},
            execution="client",
        ),
        ResponseToolSearchOutputItemParamParam(
            type="tool_search_output",
            call_id=ts,
            execution="client",
            tools=[
                {
                    "type": "mcp",
                    "server_label": "tracker",
                    "server_url": "https://t.example",
                    "authorization": mark("authorization"),
                    "headers": {"X-Api-Key": mark("headers")},
                }
            ],
        ),
        item_param.AdditionalTools(
            type="additional_tools",
            role="developer",
            tools=[
                {"type": "function", "name": "read_changelog", "parameters": {}, "strict": True}
            ],
        ),
        ResponseConfigurationUpdateItemParamParam(
            type="configuration_update", reasoning={"effort": "low"}
        ),
        item_param.Program(
            type="program",
            id=mark.id("prog"),
            call_id=prog,
            code="const r = await tools.grep({pattern: 'round'});",
            fingerprint=mark("fingerprint"),
        ),
        item_param.ProgramOutput(
            type="program_output",
            id=mark.id("progo"),
            call_id=prog,
            result="3 matches",
            status="completed",
        ),
        item_param.ItemReference(type="item_reference", id=mark.id("msg")),
        ResponseOutputMessageParam(
            type="message",
            id=mark.id("msg"),
            role="assistant",
            status="completed",
            phase="final_answer",
            content=[
                ResponseOutputTextParam(type="output_text", text="Fixed.", annotations=[]),
                ResponseOutputRefusalParam(type="refusal", refusal="No key printing."),
            ],
        ),
        item_param.CompactionTrigger(type="compaction_trigger"),
    ]


READABLE = [
    "Totals round wrong; fix them.",
    "Find where totals are rounded.",
    "round() uses banker's rounding",
    "src/pricing.py:12: def round_total(",
    "*** Update File: src/pricing.py",
    '"button":"left"',
    '"command":["pytest","-q"]',
    "warning: CRLF",
    "[exit code 0]",
    "[timeout]",
    "+- Fix rounding",
    "python round half even decimal",
    "Round half to even.",
    "a rounding chart",
    "print(round(2.5))",
    "Search the docs.",
    '{"q": "rounding"}',
    '"approve":true',
    "Rounding: half to even.",
    "changelog tools",
    "https://t.example",
    "read_changelog",
    '"effort":"low"',
    "tools.grep",
    "3 matches",
    "No key printing.",
]


def test_every_responses_item_is_read_for_its_readable_parts() -> None:
    mark = Markers("n")
    items = responses_items(mark)
    assert {i.get("type", "message") for i in items} == SDK_ITEMS.keys() - {"compaction"}
    messages = formats.to_messages("responses", items)
    assert len(messages) == len(items)
    assert all(m.unknown_types == () for m in messages)
    text = _texts(messages)
    for readable in READABLE:
        assert readable in text
    for marker in mark.all:
        assert marker not in text
    by_type = {item.get("type", "message"): m for item, m in zip(items, messages, strict=True)}
    # Calls pair with their outputs (an approval response with its request).
    for output, call in [
        ("function_call_output", "function_call"), ("custom_tool_call_output", "custom_tool_call"),
        ("computer_call_output", "computer_call"), ("local_shell_call_output", "local_shell_call"),
        ("shell_call_output", "shell_call"), ("apply_patch_call_output", "apply_patch_call"),
        ("tool_search_output", "tool_search_call"), ("program_output", "program"),
        ("mcp_approval_response", "mcp_approval_request"),
    ]:  # fmt: skip
        assert by_type[output].role == "tool"
        assert by_type[output].tool_call_id == by_type[call].tool_calls[0].id
        assert by_type[output].tool_name == by_type[call].tool_calls[0].name
    assert by_type["mcp_approval_request"].tool_calls[0].name == "search_docs"
    assert [a.kind for a in by_type["image_generation_call"].attachments] == ["image"]
    assert [a.kind for a in by_type["computer_call_output"].attachments] == ["image"]
    assert by_type["reasoning"].joins_next


def test_unchanged_responses_items_render_as_they_came() -> None:
    items = responses_items(Markers("u"))
    messages = formats.to_messages("responses", items)
    rendered = formats.render("responses", messages, with_ids=True, source=items)
    dropped = {"message", "function_call", "function_call_output", "custom_tool_call",
               "custom_tool_call_output"}  # fmt: skip
    assert rendered == [
        {k: v for k, v in i.items() if k != "id" or i.get("type", "message") not in dropped}
        for i in items
    ]


def test_responses_items_and_parts_of_unknown_types_are_carried_and_counted() -> None:
    future = {"type": "hologram_call", "call_id": "h1", "scene": {"depth": 3}}
    answer = {"type": "hologram_call_output", "call_id": "h1", "frames": 24}
    stray = {"type": "hologram_call_output", "call_id": "nobody", "frames": 1}
    part = {"type": "input_video", "video_url": "https://example.com/v.mp4"}
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "Render it."}, part]},
        future,
        answer,
        stray,
        {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_video", "n": 1}]},
        {"type": "message", "role": "assistant", "content": "Done."},
    ]
    messages = formats.to_messages("responses", items)
    assert [m.unknown_types for m in messages] == [
        ("input_video",), ("hologram_call",), ("hologram_call_output",),
        ("hologram_call_output",), ("summary_video",), (),
    ]  # fmt: skip
    assert messages[0].content == "Render it."
    # A call and the output naming it pair (one group); an output naming no call stands alone.
    assert [(c.id, c.name, c.arguments) for c in messages[1].tool_calls] == [("h1", "hologram", "")]
    assert (messages[2].role, messages[2].tool_call_id) == ("tool", "h1")
    assert (messages[3].role, messages[3].tool_call_id) == ("assistant", None)
    for m, raw in zip(messages[1:4], items[1:4], strict=True):
        (payload,) = m.attachments
        assert payload.tokens == math.ceil(len(canonical_json(raw)) / OPAQUE_CHARS_PER_TOKEN)
    assert "depth" not in _texts(messages) and "frames" not in _texts(messages)
    assert formats.render("responses", messages, with_ids=False, source=items)[:5] == items[:5]
    # Stripped, an exchange of an unknown type is still carried as it came.
    stripped = messages[1].model_copy(
        update={"tool_calls": (messages[1].tool_calls[0].model_copy(
            update={"arguments": STRIPPED_ARGUMENTS}),)}
    )  # fmt: skip
    shortened = messages[2].model_copy(update={"content": STRIPPED_RESPONSE})
    assert formats.render("responses", [stripped, shortened], with_ids=False, source=items) == [
        future,
        answer,
    ]


def test_an_item_reference_may_come_without_its_type() -> None:
    items: list[Any] = [item_param.ItemReference(id="msg_stored"), {"type": None, "id": "rs_x"}]
    messages = formats.to_messages("responses", items)
    assert [(m.id, m.role, m.content) for m in messages] == [
        ("msg_stored", "assistant", '{"type":"item_reference"}'),
        ("rs_x", "assistant", '{"type":"item_reference"}'),
    ]
    assert formats.render("responses", messages, with_ids=True, source=items) == items


RESPONSES_REJECTED: dict[str, tuple[list[Any], str, str]] = {
    "compaction without content": ([{"type": "compaction"}], "messages[0].encrypted_content",
                                   "string"),
    "shell output entry without stdout": (
        [{"type": "shell_call", "call_id": "s", "action": {"commands": ["ls"]}},
         {"type": "shell_call_output", "call_id": "s", "output": [{"stderr": ""}]}],
        "messages[1].output[0].stdout", "string"),
    "shell output entry not an object": (
        [{"type": "shell_call", "call_id": "s", "action": {"commands": ["ls"]}},
         {"type": "shell_call_output", "call_id": "s", "output": ["ls"]}],
        "messages[1].output[0]", "object"),
    "approval response without its request": (
        [{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}],
        "messages[0]", "answers no earlier tool call"),
    "approval request without name": (
        [{"type": "mcp_approval_request", "id": "mcpr_1", "arguments": "{}",
          "server_label": "s"}], "messages[0].name", "non-empty"),
    "program without code": ([{"type": "program", "id": "p", "call_id": "p1",
                               "fingerprint": "f"}], "messages[0].code", "string"),
    "program output without result": (
        [{"type": "program", "id": "p", "call_id": "p1", "code": "", "fingerprint": "f"},
         {"type": "program_output", "id": "po", "call_id": "p1", "status": "completed"}],
        "messages[1].result", "string"),
    "reasoning content not a list": ([{"type": "reasoning", "id": "r", "summary": [],
                                       "content": "x"}], "messages[0].content", "list"),
    "anthropic tool_result part": (
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
        "messages[0].content[0].type", "anthropic"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(RESPONSES_REJECTED))
def test_bad_responses_items_name_the_field(case: str) -> None:
    items, field, reason = RESPONSES_REJECTED[case]
    with pytest.raises(InvalidSnapshot) as info:
        formats.to_messages("responses", items)
    assert info.value.field == field
    assert reason in info.value.reason


def _responses_filler(turns: int, tag: str = "read") -> list[Any]:
    out: list[Any] = []
    for k in range(turns):
        out += [
            {"role": "user", "content": f"Check module {k} for rounding."},
            {"type": "function_call", "call_id": f"{tag}_{k}", "name": "read_file",
             "arguments": f'{{"path": "src/m{k}.py"}}'},
            {"type": "function_call_output", "call_id": f"{tag}_{k}", "output": LOG},
        ]  # fmt: skip
    return out


def _with_tail(items: list[Any], filler: list[Any]) -> list[Any]:
    """``items`` but their last (the compaction trigger, which must come last), then filler,
    then a newest user turn and the trigger: every typed item falls in the compacted range."""
    return [*items[:-1], *filler, {"role": "user", "content": "Now the changelog."}, items[-1]]


def test_a_responses_compaction_keeps_opaque_items_whole_and_out_of_the_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mark = Markers("q")
    caplog.set_level(logging.DEBUG)
    history = _with_tail(responses_items(mark), _responses_filler(4))
    event = _compact(_snapshot("responses", history, 600), tmp_path)
    assert isinstance(event, CompletedEvent), event
    assert event.trigger.unknown_types == {}
    assert event.compaction.start == 1  # the developer message stays
    applied = apply_compaction(history, event)
    assert_opaque_intact(history, applied, mark.opaque)
    assert_nothing_leaked(event, mark)
    formats.to_messages("responses", applied)  # still a valid history
    parsed = parse_snapshot(_snapshot("responses", history, 600), Settings())
    assert tokens_of(applied, parsed, TOKENIZER) == event.compaction.tokens_after
    assert_not_logged(caplog, mark)


def test_stripped_responses_exchanges_are_rewritten_or_carried_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mark = Markers("t")
    caplog.set_level(logging.DEBUG)
    history = _with_tail(responses_items(mark), _responses_filler(4))
    tools = {"*": {"compaction": "strip"}}
    event = _compact(_snapshot("responses", history, 600, tools=tools), tmp_path)
    assert isinstance(event, CompletedEvent), event
    carried = event.compaction.replacement[:-1]
    by_call: dict[str, list[dict[str, Any]]] = {}
    for item in carried:
        cid = item.get("call_id") or item.get("approval_request_id") or item.get("id")
        by_call.setdefault(str(cid), []).append(item)
    typed: dict[str, Any] = {}
    for item in history:
        typed.setdefault(item.get("type", "message"), item)
    # A custom tool's exchange stays custom; a function call keeps its namespace.
    assert by_call[typed["custom_tool_call"]["call_id"]] == [
        {"type": "custom_tool_call", "call_id": typed["custom_tool_call"]["call_id"],
         "name": "apply_patch", "input": STRIPPED_ARGUMENTS},
        {"type": "custom_tool_call_output", "call_id": typed["custom_tool_call"]["call_id"],
         "output": STRIPPED_RESPONSE},
    ]  # fmt: skip
    fc = by_call[typed["function_call"]["call_id"]]
    assert fc[0]["namespace"] == "repo" and fc[0]["arguments"] == STRIPPED_ARGUMENTS
    # Exchanges that cannot be rebuilt are carried as they came, both halves.
    for call, output in [("mcp_approval_request", "mcp_approval_response"),
                         ("program", "program_output"),
                         ("tool_search_call", "tool_search_output")]:  # fmt: skip
        assert typed[call] in carried and typed[output] in carried
    applied = apply_compaction(history, event)
    formats.to_messages("responses", applied)  # every output still answers its call
    assert_opaque_intact(history, applied, mark.opaque)
    assert_nothing_leaked(event, mark)
    assert_not_logged(caplog, mark)


def test_shell_output_projection_stays_a_shell_output() -> None:
    items = responses_items(Markers("p"))
    shell = next(i for i in items if i.get("type") == "shell_call_output")
    (edited,) = formats.replace_tool_results("responses", [shell], {shell["call_id"]: "[gone]"})
    assert edited == {
        **shell,
        "output": [{"stdout": "[gone]", "stderr": "", "outcome": {"type": "timeout"}}],
    }
    call = next(i for i in items if i.get("type") == "shell_call")
    formats.to_messages("responses", [call, edited])


# --- a Responses compaction item: the provider's boundary ------------------------------------


def native_history(mark: Markers) -> tuple[list[Any], int]:
    """An agent run the provider compacted once (its ``compaction`` item), then went on; and
    where the compaction item is."""
    before = [
        {"type": "message", "role": "developer", "content": "Work in src/ only."},
        *_responses_filler(3),
        ResponseReasoningItemParam(
            type="reasoning",
            id=mark.id("rs"),
            summary=[],
            encrypted_content=mark("encryptedcontent"),
        ),
        {"role": "assistant", "content": "Checked three modules."},
    ]
    compaction = ResponseCompactionItemParamParam(
        type="compaction", id=mark.id("cmp"), encrypted_content=mark("encryptedcontent") * 40
    )
    after = [
        {"role": "user", "content": "Continue with module 3."},
        ResponseReasoningItemParam(
            type="reasoning",
            id=mark.id("rs"),
            summary=[{"type": "summary_text", "text": "Read module 3 next."}],
            encrypted_content=mark("encryptedcontent"),
        ),
        *_responses_filler(5, "later")[1:],
        {"role": "user", "content": "Now the changelog."},
        {"role": "assistant", "content": "On it."},
    ]
    return [*before, compaction, *after], len(before)


def test_nothing_before_a_compaction_item_is_counted(tmp_path: Path) -> None:
    history, at = native_history(Markers("b"))
    messages = formats.to_messages("responses", history)
    assert messages[at].native_compaction and messages[at].content == ""
    (payload,) = messages[at].attachments
    encrypted = history[at]["encrypted_content"]
    assert (payload.kind, payload.label) == ("opaque", "compaction (encrypted)")
    assert payload.tokens == math.ceil(len(encrypted) / OPAQUE_CHARS_PER_TOKEN)
    assert [m.superseded for m in messages] == [False] + [True] * (at - 1) + [False] * (
        len(history) - at
    )
    trigger = _trigger(_snapshot("responses", history, 100_000), tmp_path)
    assert trigger.native_compaction
    assert trigger.counted_by == "tiktoken+opaque-estimate"
    # The request counts as if it opened at the compaction item (after the system prompt).
    trimmed = [history[0], *history[at:]]
    assert (
        trigger.projected_tokens
        == _trigger(_snapshot("responses", trimmed, 100_000), tmp_path).projected_tokens
    )
    assert (
        trigger.projected_tokens
        < _trigger(
            _snapshot("responses", [i for i in history if i.get("type") != "compaction"], 100_000),
            tmp_path,
        ).projected_tokens
    )


def test_usage_covering_the_compaction_item_counts_it(tmp_path: Path) -> None:
    history, at = native_history(Markers("v"))
    estimated = _trigger(_snapshot("responses", history, 100_000), tmp_path)
    usage = {"input_tokens": estimated.projected_tokens, "message_count": at + 2}
    covered = _trigger(_snapshot("responses", history, 100_000, usage=usage), tmp_path)
    assert covered.usage_ignored is None
    assert covered.counted_by == "usage+tiktoken"
    beyond = {"input_tokens": estimated.projected_tokens // 2, "message_count": at}
    short = _trigger(_snapshot("responses", history, 100_000, usage=beyond), tmp_path)
    assert short.counted_by == "usage+tiktoken+opaque-estimate"


def test_a_compaction_never_reaches_back_past_the_compaction_item(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mark = Markers("x")
    caplog.set_level(logging.DEBUG)
    history, at = native_history(mark)
    event = _compact(_snapshot("responses", history, 300), tmp_path)
    assert isinstance(event, CompletedEvent), event
    assert event.trigger.native_compaction
    assert event.compaction.start == at + 1
    applied = apply_compaction(history, event)
    assert applied[: at + 1] == history[: at + 1]  # the compaction item, id and all
    assert_opaque_intact(history, applied, mark.opaque)
    assert_nothing_leaked(event, mark)
    again = formats.to_messages("responses", applied)
    assert again[at].native_compaction
    assert_not_logged(caplog, mark)
