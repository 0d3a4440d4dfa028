"""The Anthropic format against the installed SDK (anthropic 2.17.0): every content block of
``ContentBlockParam`` and ``BetaContentBlockParam`` is accepted in the role the API puts it in,
its readable parts are read, its opaque parts never are, an unchanged message is carried byte
for byte, server tools pair within an assistant turn (across a ``pause_turn``), a
``compaction`` block is the provider's own compaction, and a compaction by the service leaves
every opaque field as it was or gone with its whole message. Every block is built from the
SDK's own TypedDicts."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest
from anthropic.types import (
    Base64ImageSourceParam,
    Base64PDFSourceParam,
    BashCodeExecutionOutputBlockParam,
    BashCodeExecutionResultBlockParam,
    BashCodeExecutionToolResultBlockParam,
    CacheControlEphemeralParam,
    CitationsConfigParam,
    CitationWebSearchResultLocationParam,
    CodeExecutionOutputBlockParam,
    CodeExecutionResultBlockParam,
    CodeExecutionToolResultBlockParam,
    ContainerUploadBlockParam,
    ContentBlockParam,
    ContentBlockSourceParam,
    DocumentBlockParam,
    EncryptedCodeExecutionResultBlockParam,
    FileDocumentSourceParam,
    ImageBlockParam,
    PlainTextSourceParam,
    RedactedThinkingBlockParam,
    SearchResultBlockParam,
    ServerToolUseBlockParam,
    TextBlockParam,
    TextEditorCodeExecutionCreateResultBlockParam,
    TextEditorCodeExecutionStrReplaceResultBlockParam,
    TextEditorCodeExecutionToolResultBlockParam,
    TextEditorCodeExecutionViewResultBlockParam,
    ThinkingBlockParam,
    ToolReferenceBlockParam,
    ToolResultBlockParam,
    ToolSearchToolResultBlockParam,
    ToolSearchToolSearchResultBlockParam,
    ToolUseBlockParam,
    URLPDFSourceParam,
    WebFetchBlockParam,
    WebFetchToolResultBlockParam,
    WebFetchToolResultErrorBlockParam,
    WebSearchResultBlockParam,
    WebSearchToolResultBlockParam,
)
from anthropic.types import tool_result_block_param as ga_tool_result
from anthropic.types.beta import (
    BetaAdvisorRedactedResultBlockParam,
    BetaAdvisorResultBlockParam,
    BetaAdvisorToolResultBlockParam,
    BetaAssistantMessageParam,
    BetaCompactionBlockParam,
    BetaContentBlockParam,
    BetaFallbackBlockParam,
    BetaMCPToolListingBlockParam,
    BetaMCPToolParamParam,
    BetaMCPToolUseBlockParam,
    BetaRequestMCPToolResultBlockParam,
    BetaRequestToolAdditionBlockParam,
    BetaRequestToolRemovalBlockParam,
    BetaServerToolUseBlockParam,
    BetaTextBlockParam,
    BetaToolChangeToolReferenceParam,
    BetaUserMessageParam,
)

from worker.config import Settings
from worker.core.groups import group_messages
from worker.errors import InvalidSnapshot
from worker.pipeline import Adapters, Pipeline, SnapshotContext
from worker.pipeline.evaluate import evaluate
from worker.reuse import Reuse
from worker.summarize.digest import DigestSummarizer
from worker.tokens import tokenizer_for
from worker.transcripts.filesystem import FileStore
from worker.wire import formats
from worker.wire.events import CompletedEvent
from worker.wire.formats import anthropic
from worker.wire.history import apply_compaction
from worker.wire.models import Message
from worker.wire.snapshots import parse_snapshot

# Every opaque value below holds this marker, so that "no opaque value" is one search. (The
# client's own tool_use ids are not opaque: they pair calls and results, and name them to the
# summarizer, as they always did.)
OPAQUE = "OPAQUE"


def sdk_block_types(union: Any) -> set[str]:
    """The ``type`` literals of a union's members, TypedDicts (params) and models alike."""
    found: set[str] = set()
    for member in typing.get_args(union):
        if typing.get_origin(member) is typing.Annotated:
            found |= sdk_block_types(typing.get_args(member)[0])
        elif typing.get_origin(member) is typing.Union:
            found |= sdk_block_types(member)
        elif isinstance(member, type) and issubclass(member, pydantic.BaseModel):
            found |= set(typing.get_args(member.model_fields["type"].annotation))
        else:
            kind = typing.get_type_hints(member, include_extras=True)["type"]
            while typing.get_origin(kind) is not typing.Literal:  # Required[Literal[...]]
                kind = typing.get_args(kind)[0]
            found |= set(typing.get_args(kind))
    return found


def test_every_block_type_of_the_installed_sdk_is_known() -> None:
    missing = {
        "ContentBlockParam": sdk_block_types(ContentBlockParam) - anthropic.BLOCK_TYPES,
        "BetaContentBlockParam": sdk_block_types(BetaContentBlockParam) - anthropic.BLOCK_TYPES,
        "ToolResultBlockParam content": sdk_block_types(ga_tool_result.Content)
        - anthropic.RESULT_BLOCK_TYPES,
    }
    assert not any(missing.values()), f"block types the format does not know: {missing}"
    assert len(sdk_block_types(ContentBlockParam)) == 16


# --- one history per realistic shape, built from the SDK's TypedDicts --------------------------

CACHE = CacheControlEphemeralParam(type="ephemeral")


def user(*blocks: Any) -> dict[str, Any]:
    return dict(BetaUserMessageParam(role="user", content=list(blocks)))


def assistant(*blocks: Any) -> dict[str, Any]:
    return dict(BetaAssistantMessageParam(role="assistant", content=list(blocks)))


def text(value: str, **extra: Any) -> TextBlockParam:
    return TextBlockParam(type="text", text=value, **extra)


def server_use(cid: str, name: Any, **arguments: Any) -> ServerToolUseBlockParam:
    return ServerToolUseBlockParam(type="server_tool_use", id=cid, name=name, input=arguments)


def client_use(cid: str, name: str, **arguments: Any) -> ToolUseBlockParam:
    return ToolUseBlockParam(type="tool_use", id=cid, name=name, input=arguments)


def client_result(cid: str, body: Any) -> ToolResultBlockParam:
    return ToolResultBlockParam(type="tool_result", tool_use_id=cid, content=body)


def web_search() -> list[dict[str, Any]]:
    cid = f"srvtoolu_{OPAQUE}_ws1"
    cited = CitationWebSearchResultLocationParam(
        type="web_search_result_location",
        cited_text="Tokio is an asynchronous runtime",
        encrypted_index=f"{OPAQUE}-index-1",
        title="Tokio - An asynchronous Rust runtime",
        url="https://tokio.rs",
    )
    return [
        user(text("Which async runtime should the service use?")),
        assistant(
            text("Let me search for that."),
            server_use(cid, "web_search", query="rust async runtime comparison"),
            WebSearchToolResultBlockParam(
                type="web_search_tool_result",
                tool_use_id=cid,
                content=[
                    WebSearchResultBlockParam(
                        type="web_search_result",
                        title="Tokio - An asynchronous Rust runtime",
                        url="https://tokio.rs",
                        encrypted_content=f"{OPAQUE}-page-tokio-" + "x" * 300,
                        page_age="3 days ago",
                    ),
                    WebSearchResultBlockParam(
                        type="web_search_result",
                        title="async-std",
                        url="https://async.rs",
                        encrypted_content=f"{OPAQUE}-page-async-std",
                    ),
                ],
                cache_control=CACHE,
            ),
            text("Tokio is the most used runtime.", citations=[cited]),
        ),
    ]


def web_fetch() -> list[dict[str, Any]]:
    ok, failed = f"srvtoolu_{OPAQUE}_wf1", f"srvtoolu_{OPAQUE}_wf2"
    page = DocumentBlockParam(
        type="document",
        source=PlainTextSourceParam(
            type="text", media_type="text/plain", data="The guide says: pin the toolchain."
        ),
        title="Release guide",
        citations=CitationsConfigParam(enabled=True),
    )
    return [
        user(text("Read https://example.com/guide and https://example.com/gone")),
        assistant(
            server_use(ok, "web_fetch", url="https://example.com/guide"),
            WebFetchToolResultBlockParam(
                type="web_fetch_tool_result",
                tool_use_id=ok,
                content=WebFetchBlockParam(
                    type="web_fetch_result",
                    url="https://example.com/guide",
                    retrieved_at="2026-01-10T10:00:00Z",
                    content=page,
                ),
            ),
            server_use(failed, "web_fetch", url="https://example.com/gone"),
            WebFetchToolResultBlockParam(
                type="web_fetch_tool_result",
                tool_use_id=failed,
                content=WebFetchToolResultErrorBlockParam(
                    type="web_fetch_tool_result_error", error_code="url_not_accessible"
                ),
            ),
            text("The guide says to pin the toolchain; the other page is gone."),
        ),
    ]


def code_execution() -> list[dict[str, Any]]:
    run, bash, view, create, edit, hidden = (f"srvtoolu_{OPAQUE}_ce{k}" for k in range(1, 7))
    return [
        user(
            text("Analyse the uploaded CSV."),
            ContainerUploadBlockParam(type="container_upload", file_id=f"file_{OPAQUE}_csv"),
        ),
        assistant(
            server_use(run, "code_execution", code="print(6 * 7)"),
            CodeExecutionToolResultBlockParam(
                type="code_execution_tool_result",
                tool_use_id=run,
                content=CodeExecutionResultBlockParam(
                    type="code_execution_result",
                    stdout="42\n",
                    stderr="",
                    return_code=0,
                    content=[
                        CodeExecutionOutputBlockParam(
                            type="code_execution_output", file_id=f"file_{OPAQUE}_plot"
                        )
                    ],
                ),
            ),
            server_use(bash, "bash_code_execution", command="wc -l data.csv"),
            BashCodeExecutionToolResultBlockParam(
                type="bash_code_execution_tool_result",
                tool_use_id=bash,
                content=BashCodeExecutionResultBlockParam(
                    type="bash_code_execution_result",
                    stdout="1204 data.csv",
                    stderr="warning: trailing newline missing",
                    return_code=0,
                    content=[
                        BashCodeExecutionOutputBlockParam(
                            type="bash_code_execution_output", file_id=f"file_{OPAQUE}_out"
                        )
                    ],
                ),
            ),
            server_use(view, "text_editor_code_execution", command="view", path="notes.md"),
            TextEditorCodeExecutionToolResultBlockParam(
                type="text_editor_code_execution_tool_result",
                tool_use_id=view,
                content=TextEditorCodeExecutionViewResultBlockParam(
                    type="text_editor_code_execution_view_result",
                    content="columns: date, region, revenue",
                    file_type="text",
                    num_lines=1,
                    start_line=1,
                    total_lines=1,
                ),
            ),
            server_use(create, "text_editor_code_execution", command="create", path="a.py"),
            TextEditorCodeExecutionToolResultBlockParam(
                type="text_editor_code_execution_tool_result",
                tool_use_id=create,
                content=TextEditorCodeExecutionCreateResultBlockParam(
                    type="text_editor_code_execution_create_result", is_file_update=False
                ),
            ),
            server_use(edit, "text_editor_code_execution", command="str_replace", path="a.py"),
            TextEditorCodeExecutionToolResultBlockParam(
                type="text_editor_code_execution_tool_result",
                tool_use_id=edit,
                content=TextEditorCodeExecutionStrReplaceResultBlockParam(
                    type="text_editor_code_execution_str_replace_result",
                    lines=["total = revenue.sum()"],
                    new_lines=1,
                    new_start=3,
                    old_lines=1,
                    old_start=3,
                ),
            ),
            server_use(hidden, "code_execution", code="secret_step()"),
            CodeExecutionToolResultBlockParam(
                type="code_execution_tool_result",
                tool_use_id=hidden,
                content=EncryptedCodeExecutionResultBlockParam(
                    type="encrypted_code_execution_result",
                    encrypted_stdout=f"{OPAQUE}-stdout",
                    stderr="",
                    return_code=0,
                    content=[],
                ),
            ),
            text("The file has 1204 rows."),
        ),
    ]


def tool_search() -> list[dict[str, Any]]:
    cid = f"srvtoolu_{OPAQUE}_ts1"
    return [
        user(text("What is the weather in Lyon?")),
        assistant(
            server_use(cid, "tool_search_tool_regex", pattern="weather"),
            ToolSearchToolResultBlockParam(
                type="tool_search_tool_result",
                tool_use_id=cid,
                content=ToolSearchToolSearchResultBlockParam(
                    type="tool_search_tool_search_result",
                    tool_references=[
                        ToolReferenceBlockParam(type="tool_reference", tool_name="get_weather")
                    ],
                ),
            ),
            client_use("toolu_weather", "get_weather", city="Lyon"),
        ),
        user(
            client_result(
                "toolu_weather",
                [
                    text("Sunny, 21 degrees in Lyon"),
                    ToolReferenceBlockParam(type="tool_reference", tool_name="get_forecast"),
                ],
            )
        ),
    ]


def mcp() -> list[dict[str, Any]]:
    cid = f"mcptoolu_{OPAQUE}_1"
    return [
        user(
            text("List the open issues."),
            BetaRequestToolAdditionBlockParam(
                type="tool_addition",
                tool=BetaToolChangeToolReferenceParam(type="tool_reference", name="list_issues"),
            ),
        ),
        assistant(
            BetaMCPToolListingBlockParam(
                type="mcp_tool_listing",
                mcp_server_name="github",
                tools=[
                    BetaMCPToolParamParam(
                        name="list_issues", input_schema={"type": "object"}, description="x"
                    )
                ],
            ),
            BetaMCPToolUseBlockParam(
                type="mcp_tool_use",
                id=cid,
                name="list_issues",
                server_name="github",
                input={"repo": "acme/app"},
            ),
            BetaRequestMCPToolResultBlockParam(
                type="mcp_tool_result",
                tool_use_id=cid,
                content=[BetaTextBlockParam(type="text", text="3 open issues: #12, #15, #19")],
                is_error=False,
            ),
            text("There are three open issues."),
        ),
        user(
            text("Thanks, that is all."),
            BetaRequestToolRemovalBlockParam(
                type="tool_removal",
                tool=BetaToolChangeToolReferenceParam(type="tool_reference", name="list_issues"),
            ),
        ),
    ]


def documents() -> list[dict[str, Any]]:
    return [
        user(
            DocumentBlockParam(
                type="document",
                source=PlainTextSourceParam(
                    type="text", media_type="text/plain", data="Clause 4: payment in 30 days."
                ),
                title="Contract",
                context="Signed in March.",
                cache_control=CACHE,
            ),
            DocumentBlockParam(
                type="document",
                source=Base64PDFSourceParam(
                    type="base64", media_type="application/pdf", data=f"{OPAQUE}-pdf-base64"
                ),
                title="Invoice",
            ),
            DocumentBlockParam(
                type="document",
                source=URLPDFSourceParam(type="url", url="https://example.com/paper.pdf"),
            ),
            DocumentBlockParam(
                type="document",
                source=ContentBlockSourceParam(
                    type="content", content=[text("Appendix: late fees are 2 percent.")]
                ),
                title="Appendix",
            ),
            DocumentBlockParam(
                type="document",
                source=FileDocumentSourceParam(type="file", file_id=f"file_{OPAQUE}_doc"),
                title="Annex",
            ),
            SearchResultBlockParam(
                type="search_result",
                title="Payment terms FAQ",
                source="https://example.com/faq",
                content=[text("Invoices are due in 30 days.")],
                citations=CitationsConfigParam(enabled=True),
            ),
            ImageBlockParam(
                type="image",
                source=Base64ImageSourceParam(
                    type="base64", media_type="image/png", data=f"{OPAQUE}AAAA"
                ),
            ),
            text("When is the invoice due?"),
        ),
        assistant(
            client_use("toolu_kb", "kb_search", query="late fees"),
        ),
        user(
            client_result(
                "toolu_kb",
                [
                    SearchResultBlockParam(
                        type="search_result",
                        title="Late fees",
                        source="kb://fees",
                        content=[text("Late fees accrue daily.")],
                    )
                ],
            )
        ),
        assistant(text("Payment is due in 30 days; late fees are 2 percent.")),
    ]


def thinking() -> list[dict[str, Any]]:
    return [
        user(text("Why does the parser fail on empty input?")),
        assistant(
            ThinkingBlockParam(
                type="thinking",
                thinking="The loop reads past the end when the input is empty.",
                signature=f"{OPAQUE}-signature-1",
            ),
            RedactedThinkingBlockParam(type="redacted_thinking", data=f"{OPAQUE}-redacted-1"),
            text("It reads past the end; checking the loop."),
            client_use("toolu_grep", "grep", pattern="while"),
        ),
        user(client_result("toolu_grep", "src/parse.py:12: while i <= len(s):")),
    ]


def advisor() -> list[dict[str, Any]]:
    first, second = f"srvtoolu_{OPAQUE}_ad1", f"srvtoolu_{OPAQUE}_ad2"
    return [
        user(text("Pick a database.")),
        assistant(
            BetaServerToolUseBlockParam(
                type="server_tool_use", id=first, name="advisor", input={"question": "which db"}
            ),
            BetaAdvisorToolResultBlockParam(
                type="advisor_tool_result",
                tool_use_id=first,
                content=BetaAdvisorResultBlockParam(type="advisor_result", text="Use Postgres."),
            ),
            BetaServerToolUseBlockParam(
                type="server_tool_use", id=second, name="advisor", input={"question": "why"}
            ),
            BetaAdvisorToolResultBlockParam(
                type="advisor_tool_result",
                tool_use_id=second,
                content=BetaAdvisorRedactedResultBlockParam(
                    type="advisor_redacted_result", encrypted_content=f"{OPAQUE}-advice"
                ),
            ),
            BetaFallbackBlockParam(
                **{"type": "fallback", "from": {"model": "claude-opus-4-1"}},
                to={"model": "claude-sonnet-4-5"},
            ),
            text("Postgres it is."),
        ),
    ]


def pause_turn() -> list[dict[str, Any]]:
    cid = f"srvtoolu_{OPAQUE}_pt1"
    return [
        user(text("Search for the changelog of tokio 2.")),
        assistant(server_use(cid, "web_search", query="tokio 2 changelog")),
        assistant(
            WebSearchToolResultBlockParam(
                type="web_search_tool_result",
                tool_use_id=cid,
                content=[
                    WebSearchResultBlockParam(
                        type="web_search_result",
                        title="Tokio changelog",
                        url="https://tokio.rs/changelog",
                        encrypted_content=f"{OPAQUE}-changelog",
                    )
                ],
            ),
            text("The changelog lists a new scheduler."),
        ),
    ]


def compaction(**shape: Any) -> list[dict[str, Any]]:
    return [
        user(text("Long task, part one.")),
        assistant(text("Part one done: the parser handles empty input.")),
        user(text("Go on.")),
        assistant(
            BetaCompactionBlockParam(type="compaction", **shape),
            text("Continuing with part two."),
        ),
    ]


SUMMARY = "Earlier: the parser was fixed and its tests pass."
TOOL_CHANGE = BetaRequestToolAdditionBlockParam(
    type="tool_addition",
    tool=BetaToolChangeToolReferenceParam(type="tool_reference", name="get_weather"),
)
UNKNOWN = {"type": "hologram", "frames": 12, "data": f"{OPAQUE}-hologram", "title": "scene"}

SHAPES: dict[str, tuple[list[dict[str, Any]], list[str]]] = {
    "web-search": (
        web_search(),
        ["rust async runtime comparison", "https://tokio.rs", "async-std", "3 days ago"],
    ),
    "web-fetch": (
        web_fetch(),
        ["https://example.com/guide", "pin the toolchain", "Release guide", "url_not_accessible"],
    ),
    "code-execution": (
        code_execution(),
        [
            "print(6 * 7)",
            "42",
            "wc -l data.csv",
            "1204 data.csv",
            "trailing newline missing",
            "columns: date, region, revenue",
            "file created",
            "total = revenue.sum()",
            "file uploaded to the code execution container",
        ],
    ),
    "tool-search": (
        tool_search(),
        ["weather", "get_weather", "Sunny, 21 degrees in Lyon", "get_forecast"],
    ),
    "mcp": (
        mcp(),
        ["github/list_issues", "acme/app", "3 open issues: #12, #15, #19", "mcp tools of github"],
    ),
    "documents": (
        documents(),
        [
            "Clause 4: payment in 30 days.",
            "Contract",
            "Signed in March.",
            "Invoice",
            "https://example.com/paper.pdf",
            "Appendix: late fees are 2 percent.",
            "Annex",
            "Payment terms FAQ",
            "Invoices are due in 30 days.",
            "Late fees accrue daily.",
        ],
    ),
    "thinking": (
        thinking(),
        ["The loop reads past the end when the input is empty.", "checking the loop"],
    ),
    "advisor-and-fallback": (advisor(), ["which db", "Use Postgres.", "Postgres it is."]),
    "pause-turn": (pause_turn(), ["tokio 2 changelog", "Tokio changelog", "new scheduler"]),
    "compaction-content": (compaction(content=SUMMARY), [SUMMARY, "part two"]),
    "compaction-encrypted": (
        compaction(content=SUMMARY, encrypted_content=f"{OPAQUE}-compaction-state"),
        [SUMMARY, "part two"],
    ),
    "compaction-signed-with-tool-changes": (
        compaction(
            content=SUMMARY, signature=f"{OPAQUE}-compaction-sig", tool_changes=[TOOL_CHANGE]
        ),
        [SUMMARY, "part two"],
    ),
    "compaction-failed": (compaction(content=None), ["Part one done", "part two"]),
    "unknown-block": (
        [user(text("Show the scene.")), assistant(text("Here it is."), UNKNOWN)],
        ["Here it is."],
    ),
}


def normalized(history: list[dict[str, Any]]) -> list[Message]:
    return formats.to_messages("anthropic", history, system="You are a careful agent.")


def read_text(messages: list[Message]) -> str:
    """Everything of the messages a summarizer or an event may see."""
    return "\n".join(
        part
        for m in messages
        for part in (
            m.content,
            m.reasoning,
            *(c.arguments for c in m.tool_calls),
            *(a.label for a in m.attachments),
        )
    )


def same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize(("history", "readable"), SHAPES.values(), ids=SHAPES.keys())
def test_each_shape_is_read_without_its_opaque_parts(
    history: list[dict[str, Any]], readable: list[str]
) -> None:
    text_seen = read_text(normalized(history))
    for part in readable:
        assert part in text_seen
    assert OPAQUE not in text_seen


HISTORIES = [history for history, _ in SHAPES.values()]


@pytest.mark.parametrize("history", HISTORIES, ids=SHAPES.keys())
def test_each_unchanged_message_renders_byte_for_byte(history: list[dict[str, Any]]) -> None:
    messages = normalized(history)
    for index, raw in enumerate(history):
        own = [m for m in messages if m.source_index == index]
        if len(own) != 1:  # tool results beside a turn: one wire message for several
            continue
        rendered = formats.render("anthropic", own, with_ids=False, source=history)
        assert same(rendered, [without_thinking(raw)]), index


def without_thinking(raw: dict[str, Any]) -> dict[str, Any]:
    """What a carried assistant turn becomes: as it was, less its thinking (a carried turn
    follows the summary, so its thinking no longer covers what precedes it); a turn holding a
    provider compaction is carried exactly."""
    content = raw.get("content")
    if raw.get("role") != "assistant" or not isinstance(content, list):
        return raw
    if any(b.get("type") == "compaction" for b in content):
        return raw
    kept = [b for b in content if b.get("type") not in ("thinking", "redacted_thinking")]
    return (
        raw
        if len(kept) == len(content)
        else {**raw, "content": kept or [{"type": "text", "text": ""}]}
    )


def test_readable_parts_reach_the_text_and_the_count() -> None:
    """A search's hits are read (and so counted); their encrypted pages are counted by the
    estimate, named by type alone."""
    (_, _, search) = normalized(web_search())
    assert "[server tool web_search]" in search.content
    assert "- Tokio - An asynchronous Rust runtime | https://tokio.rs | 3 days ago" in (
        search.content
    )
    (hidden,) = search.attachments
    assert (
        hidden.kind == "opaque" and hidden.label == "web_search_tool_result (encrypted, not read)"
    )
    assert hidden.tokens >= len(f"{OPAQUE}-page-tokio-" + "x" * 300) // 3


def test_thinking_is_reasoning_and_redacted_thinking_is_not_read() -> None:
    (_, _, turn, result) = normalized(thinking())
    assert turn.reasoning == "The loop reads past the end when the input is empty."
    assert [c.id for c in turn.tool_calls] == ["toolu_grep"]
    assert result.tool_call_id == "toolu_grep" and result.tool_name == "grep"


def test_documents_read_their_text_and_count_pdfs_and_uploads_as_files() -> None:
    (_, turn, *_) = normalized(documents())
    kinds = [a.kind for a in turn.attachments]
    # The base64 PDF, the PDF by URL and the uploaded file; the image; the text ones are text.
    assert kinds == ["file", "file", "file", "image"]
    assert [a.label for a in turn.attachments[:3]] == ["Invoice", "document", "Annex"]


# --- provider-native compaction -----------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [
        {"content": SUMMARY},
        {"content": SUMMARY, "encrypted_content": f"{OPAQUE}-state"},
        {"content": SUMMARY, "signature": f"{OPAQUE}-sig", "tool_changes": [TOOL_CHANGE]},
    ],
    ids=["content", "encrypted", "signed"],
)
def test_a_compaction_block_with_content_is_the_native_boundary(shape: dict[str, Any]) -> None:
    history = compaction(**shape)
    history[3]["content"].insert(0, text("Dropped by the API: before the block."))
    system, *body = normalized(history)
    boundary = body[3]
    assert boundary.native_compaction
    assert boundary.content == f"{SUMMARY}\nContinuing with part two."
    assert [m.superseded for m in body] == [True, True, True, False]
    assert not system.superseded


def test_a_failed_compaction_is_a_no_op_still_carried() -> None:
    history = compaction(content=None)
    _, *body = normalized(history)
    assert not any(m.native_compaction or m.superseded for m in body)
    assert body[3].content == "Continuing with part two."
    assert same(
        formats.render("anthropic", [body[3]], with_ids=False, source=history), [history[3]]
    )


def test_a_message_with_a_compaction_block_is_always_rendered_as_its_source() -> None:
    history = compaction(content=SUMMARY, encrypted_content=f"{OPAQUE}-state")
    boundary = normalized(history)[4]
    changed = boundary.model_copy(update={"content": "", "reasoning": "x"})
    rendered = formats.render("anthropic", [changed], with_ids=True, source=history)
    assert same(rendered, [{"id": boundary.id, **history[3]}])


@pytest.mark.parametrize(
    ("content", "reason"), [("", "non-empty string or null"), (7, "non-empty string or null")]
)
def test_a_compaction_block_needs_content_or_null(content: Any, reason: str) -> None:
    history = compaction(content=SUMMARY)
    history[3]["content"][0]["content"] = content
    with pytest.raises(InvalidSnapshot) as info:
        normalized(history)
    assert info.value.field == "messages[3].content[0].content"
    assert reason in info.value.reason


# --- server tools pair within an assistant turn -------------------------------------------------


def test_a_pause_turn_continuation_is_one_group_with_the_use_before_it() -> None:
    _, ask, use, result = normalized(pause_turn())
    assert use.joins_next and not result.joins_next
    groups = group_messages([ask, use, result])
    assert [(g.start, g.end) for g in groups] == [(0, 1), (1, 3)]


def test_a_use_waiting_for_its_result_is_fine() -> None:
    history = pause_turn()[:2]
    assert not normalized(history)[-1].joins_next


def test_a_grown_snapshot_links_its_new_continuation_to_a_reused_use() -> None:
    history = pause_turn()
    first = formats.normalize("anthropic", history[:2])
    ids, plain = formats.identify(history[:2])
    prior = formats.Prior(ids=ids, plain=plain, messages=first[0], equal=2, pairing=first[1])
    grown, _ = formats.normalize("anthropic", history, prior=prior)
    assert grown[1].joins_next


def result_of(cid: str) -> dict[str, Any]:
    return dict(
        WebSearchToolResultBlockParam(type="web_search_tool_result", tool_use_id=cid, content=[])
    )


REFUSED: dict[str, tuple[list[dict[str, Any]], str]] = {
    "answers-nothing": (
        [user(text("q")), assistant(text("a")), assistant(text("b"), result_of("srvtoolu_9"))],
        "messages[2].content[1].tool_use_id",
    ),
    "before-its-use": (
        [user(text("q")), assistant(result_of("s1"), server_use("s1", "web_search", query="x"))],
        "messages[1].content[0].tool_use_id",
    ),
    "after-a-user-turn": (
        [
            user(text("q")),
            assistant(server_use("s1", "web_search", query="x")),
            user(text("hm")),
            assistant(result_of("s1")),
        ],
        "messages[3].content[0].tool_use_id",
    ),
    "answered-twice": (
        [
            user(text("q")),
            assistant(server_use("s1", "web_search", query="x"), result_of("s1")),
            assistant(result_of("s1")),
        ],
        "messages[2].content[0].tool_use_id",
    ),
    "mcp-result-for-a-server-tool": (
        [
            user(text("q")),
            assistant(
                server_use("s1", "web_search", query="x"),
                BetaRequestMCPToolResultBlockParam(type="mcp_tool_result", tool_use_id="s1"),
            ),
        ],
        "messages[1].content[1].tool_use_id",
    ),
    "result-without-id": (
        [user(text("q")), assistant(text("a"), {"type": "web_search_tool_result", "content": []})],
        "messages[1].content[1].tool_use_id",
    ),
    "duplicate-use": (
        [
            user(text("q")),
            assistant(server_use("s1", "web_search", query="x"), server_use("s1", "web_fetch")),
        ],
        "messages[1].content[1].id",
    ),
    "compaction-in-a-user-turn": (
        [user(BetaCompactionBlockParam(type="compaction", content=SUMMARY))],
        "messages[0].content[0].type",
    ),
    "server-tool-use-in-a-user-turn": (
        [user(server_use("s1", "web_search", query="x"))],
        "messages[0].content[0].type",
    ),
    "tool-result-in-an-assistant-turn": (
        [user(text("q")), assistant(client_result("t1", "x"))],
        "messages[1].content[0].type",
    ),
    "mcp-use-without-server": (
        [user(text("q")), assistant({"type": "mcp_tool_use", "id": "m1", "name": "n"})],
        "messages[1].content[0].server_name",
    ),
    "tool-use-inside-a-tool-result": (
        [
            user(text("q")),
            assistant(client_use("t1", "grep")),
            user(client_result("t1", [client_use("t2", "grep")])),
        ],
        "messages[2].content[0].content[0].type",
    ),
}


@pytest.mark.parametrize(("history", "where"), REFUSED.values(), ids=REFUSED.keys())
def test_refused_naming_the_field(history: list[dict[str, Any]], where: str) -> None:
    with pytest.raises(InvalidSnapshot) as info:
        normalized(history)
    assert info.value.field == where
    assert info.value.reason


# --- unknown block types ------------------------------------------------------------------------


def test_an_unknown_block_is_accepted_carried_and_counted_by_the_estimate() -> None:
    history = [user(text("Show the scene.")), assistant(text("Here it is."), UNKNOWN),
               user(text("Again"), dict(UNKNOWN, frames=3))]  # fmt: skip
    _, _, turn, again = normalized(history)
    assert turn.unknown_types == ("hologram",) and again.unknown_types == ("hologram",)
    (estimate,) = turn.attachments
    assert estimate.kind == "opaque" and estimate.label == "hologram (unknown type, not read)"
    assert turn.content == "Here it is."
    snap = {"conversation_id": "unknown-1", "revision": 1, "format": "anthropic",
            "model": {"name": "claude-sonnet-4"}, "messages": history}  # fmt: skip
    parsed = parse_snapshot(snap, Settings())
    trigger = evaluate(SnapshotContext.of(parsed, tokenizer_for("claude-sonnet-4"))).trigger()
    assert trigger.unknown_types == {"hologram": 2}
    assert trigger.counted_by.endswith("+opaque-estimate")


def test_plain_messages_are_reusable_and_json_read_ones_are_not() -> None:
    assert anthropic.reusable(thinking()[1]) is False  # a client call: JSON arguments
    assert anthropic.reusable(documents()[0]) is True
    assert anthropic.reusable(web_search()[1]) is False
    assert anthropic.reusable(compaction(content=SUMMARY)[3]) is True
    assert anthropic.reusable(assistant(UNKNOWN)) is False


# --- a rewritten assistant turn -----------------------------------------------------------------


def kept_call_history() -> list[dict[str, Any]]:
    """An assistant turn that thought, searched the web and called the client's ``plan`` tool
    (hinted ``keep`` in the tests), and the call's result."""
    cid = f"srvtoolu_{OPAQUE}_k1"
    plan = client_use("toolu_plan", "plan", steps=["read", "fix", "test"])
    plan["cache_control"] = CACHE
    return [
        user(text("Fix the flaky test in tests/test_io.py.")),
        assistant(
            ThinkingBlockParam(
                type="thinking", thinking="Search first.", signature=f"{OPAQUE}-sig-kept"
            ),
            RedactedThinkingBlockParam(type="redacted_thinking", data=f"{OPAQUE}-redacted-kept"),
            text("Searching, then planning."),
            server_use(cid, "web_search", query="pytest flaky io"),
            WebSearchToolResultBlockParam(
                type="web_search_tool_result",
                tool_use_id=cid,
                content=[
                    WebSearchResultBlockParam(
                        type="web_search_result",
                        title="Flaky tests",
                        url="https://docs.pytest.org/flaky",
                        encrypted_content=f"{OPAQUE}-page-flaky",
                    )
                ],
            ),
            UNKNOWN,
            plan,
        ),
        user(client_result("toolu_plan", "plan saved")),
    ]


def test_a_rewritten_turn_keeps_what_it_cannot_rebuild_and_drops_its_thinking() -> None:
    history = kept_call_history()
    turn = normalized(history)[2]
    # What a carried call under a hint makes of it: no text, no reasoning, the call.
    carried = turn.model_copy(update={"content": "", "reasoning": ""})
    (rendered,) = formats.render("anthropic", [carried], with_ids=False, source=history)
    types = [b["type"] for b in rendered["content"]]
    assert types == ["server_tool_use", "web_search_tool_result", "hologram", "tool_use"]
    assert rendered["content"][:3] == history[1]["content"][3:6]  # as they were
    assert rendered["content"][3] == history[1]["content"][6]  # the call, cache_control and all
    # A stripped call keeps its block's other fields with the new arguments.
    stripped = carried.model_copy(
        update={"tool_calls": (turn.tool_calls[0].model_copy(update={"arguments": "{}"}),)}
    )
    (again,) = formats.render("anthropic", [stripped], with_ids=False, source=history)
    assert again["content"][3] == {**history[1]["content"][6], "input": {}}


def test_a_rewritten_turn_keeps_a_server_pair_only_with_both_halves() -> None:
    history = pause_turn()
    history[2]["content"].append(client_use("toolu_x", "plan"))
    _, _, use, result = normalized(history)
    rewritten = result.model_copy(update={"content": ""})
    alone = formats.render("anthropic", [rewritten], with_ids=False, source=history)
    assert [b["type"] for b in alone[0]["content"]] == ["tool_use"]  # its use is not carried
    both = formats.render("anthropic", [use, rewritten], with_ids=False, source=history)
    assert both[0] == history[1]
    assert [b["type"] for b in both[1]["content"]] == ["web_search_tool_result", "tool_use"]


def compacted(
    history: list[dict[str, Any]],
    root: Path,
    last: dict[str, Any] | None = None,
    **tools: str,
) -> tuple[CompletedEvent, list[dict[str, Any]], list[dict[str, Any]]]:
    """``history`` (opening with a user turn), then enough work to compact it, the newest turn
    ``last`` (by default a thinking assistant turn); compacted in process by the digest: the
    event, the history it was made from and the history it makes."""
    work: list[dict[str, Any]] = []
    for k in range(8):
        work += [user(text(f"Step {k}: " + "details of the step " * 60)),
                 assistant(text(f"Done with step {k}: " + "what was done " * 60))]  # fmt: skip
    last = last or assistant(
        ThinkingBlockParam(type="thinking", thinking="Wrap up.", signature=f"{OPAQUE}-sig-last"),
        text("All steps are done."),
    )
    messages = [*history, *work, user(text("Finish.")), last]
    snap = {
        "conversation_id": "blocks-1",
        "revision": 1,
        "format": "anthropic",
        "model": {"name": "claude-sonnet-4"},
        "system": "You are a careful agent.",
        "messages": messages,
        "config": {"auto_compact_threshold_tokens": 1500, "preserve_recent_user_tokens": 50,
                   "summary_max_output_tokens": 400},
        "tools": {name: {"compaction": hint} for name, hint in tools.items()},
    }  # fmt: skip
    pipeline = Pipeline(Settings(), Adapters(store=FileStore(root), digest=DigestSummarizer()),
                        Reuse())  # fmt: skip
    event = pipeline.run(pipeline.parse(json.dumps(snap).encode()))[-1]
    assert isinstance(event, CompletedEvent), event
    applied = apply_compaction(messages, event)
    normalized(applied)  # still a valid history: every call and server tool paired
    assert applied[-1] == last  # the newest assistant turn is never rewritten
    return event, messages, applied


def opaque_blocks(history: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(message index, canonical JSON) of each block holding an opaque value."""
    return [
        (i, json.dumps(b, sort_keys=True))
        for i, m in enumerate(history)
        if isinstance(m["content"], list)
        for b in m["content"]
        if OPAQUE in json.dumps(b)
    ]


def assert_opaque_intact(
    before: list[dict[str, Any]], after: list[dict[str, Any]], event: CompletedEvent
) -> None:
    """Every block of ``after`` holding an opaque value is one of ``before``'s as it was, and
    thinking only ever travels in a message that is exactly as it was."""
    original = {block for _, block in opaque_blocks(before)}
    for i, block in opaque_blocks(after):
        assert block in original, block
        if json.loads(block)["type"] in ("thinking", "redacted_thinking"):
            assert after[i] in before
    assert OPAQUE not in event.compaction.summary.text
    assert OPAQUE not in json.dumps([s.model_dump() for s in event.compaction.summary.sections])


@pytest.mark.parametrize("history", HISTORIES, ids=SHAPES.keys())
def test_a_compaction_over_each_shape_keeps_opaque_fields_intact(
    history: list[dict[str, Any]], tmp_path: Path
) -> None:
    event, messages, applied = compacted(history, tmp_path)
    native = [i for i, m in enumerate(normalized(history)[1:]) if m.native_compaction]
    if native:  # the provider's compaction and what it superseded stay as they are
        assert event.compaction.start > native[-1] and applied[: len(history)] == history
    else:  # the whole shape is compacted
        assert event.compaction.start == 0 and event.compaction.end > len(history)
    assert_opaque_intact(messages, applied, event)


def test_a_compaction_carries_a_kept_call_without_its_thinking(tmp_path: Path) -> None:
    history = kept_call_history()
    event, messages, applied = compacted(history, tmp_path, plan="keep")
    assert_opaque_intact(messages, applied, event)
    (carried,) = [m for m in applied if any(b.get("id") == "toolu_plan" for b in m["content"])]
    assert carried["role"] == "assistant" and carried != history[1]
    kinds = [b["type"] for b in carried["content"]]
    assert "thinking" not in kinds and "redacted_thinking" not in kinds
    assert kinds == ["server_tool_use", "web_search_tool_result", "hologram", "tool_use"]
    assert any(m["content"] == history[2]["content"] for m in applied)  # its result
    assert f"{OPAQUE}-sig-kept" not in json.dumps(applied)
    assert "https://docs.pytest.org/flaky" in event.compaction.summary.text  # read, summarized


def test_a_compaction_never_reaches_back_past_a_native_one(tmp_path: Path) -> None:
    history = compaction(content=SUMMARY, signature=f"{OPAQUE}-compaction-sig")
    event, _, applied = compacted(history, tmp_path)
    assert event.compaction.start >= 4  # everything up to the native compaction stays
    assert applied[:4] == history
    assert event.compaction.tokens_before > 0


def test_the_newest_assistant_turn_is_never_rewritten(tmp_path: Path) -> None:
    """Mid-turn (its calls still waiting), thinking, searching and calling a kept tool: the
    newest assistant turn is in the protected tail, so it stays exactly as it was."""
    _, turn, _ = kept_call_history()
    event, messages, applied = compacted([user(text("Start."))], tmp_path, last=turn, plan="keep")
    assert applied[-1] == turn and json.dumps(applied[-1]) == json.dumps(turn)
    assert event.compaction.end < len(messages)
    assert_opaque_intact(messages, applied, event)
