"""Anthropic Messages content blocks: every type the format knows (:data:`BLOCK_TYPES`), which
role may carry each (:data:`ALLOWED`), and the reader of each into what one message reads
(:class:`Reading`): text, thinking, a call, a server tool's use and results, a document's text,
the attachments counted, the unknown types carried. :mod:`worker.wire.formats.anthropic` reads
whole messages with these and renders them back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire import media
from worker.wire.formats.common import readable_json, string_field, unknown_payload
from worker.wire.media import Attachment, MediaRules
from worker.wire.models import ToolCall

# Server tool results, each answering a ``server_tool_use``; ``mcp_tool_result`` answers an
# ``mcp_tool_use``.
SERVER_RESULT_TYPES = frozenset(
    {
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "advisor_tool_result",
    }
)
USE_OF = {kind: "server_tool_use" for kind in SERVER_RESULT_TYPES} | {
    "mcp_tool_result": "mcp_tool_use"
}
SERVER_BLOCKS = frozenset({*USE_OF, *USE_OF.values()})
# Where the API puts each block: what the model produced (thinking, its calls, the server
# tools it ran, a compaction) only in assistant turns, a client tool's result only in user
# turns, the rest in either.
_ASSISTANT_ONLY = frozenset(
    {"thinking", "tool_use", "compaction", "fallback", "mcp_tool_listing", *SERVER_BLOCKS}
)
_USER_ONLY = frozenset({"tool_result"})
_EITHER = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "redacted_thinking",
        "container_upload",
        "tool_addition",
        "tool_removal",
    }
)
# Every content block type this format knows (anthropic 2.17.0: the 16 of ContentBlockParam
# and the beta ones of BetaContentBlockParam).
BLOCK_TYPES = _ASSISTANT_ONLY | _USER_ONLY | _EITHER
# The blocks a ``tool_result``'s content may hold.
RESULT_BLOCK_TYPES = frozenset(
    {"text", "image", "document", "search_result", "tool_reference", "browser_state"}
)
ALLOWED = {"assistant": _ASSISTANT_ONLY | _EITHER, "user": _USER_ONLY | _EITHER}


def check_typed(blocks: list[Any], where: str, field: str = "") -> None:
    """Every block an object with a string ``type``; the error names ``where[k]`` (with
    ``field`` after it: nested blocks have always named their ``.type``)."""
    for k, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidSnapshot(f"{where}[{k}]{field}", "a content block needs a string 'type'")


@dataclass
class Reading:
    """What the blocks of one message read so far."""

    rules: MediaRules
    texts: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    attachments: list[Attachment] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    native: bool = False

    def text(self, text: str) -> None:
        if text:
            self.texts.append(text)

    def unknown_block(self, kind: str, block: dict[str, Any]) -> None:
        self.unknown.append(kind)
        self.attachments.append(unknown_payload(kind, block))

    def opaque(self, label: str, chars: int) -> None:
        if chars:
            self.attachments.append(media.opaque(label, chars))

    def restart(self) -> None:
        """A compaction block with content: the API reads nothing of the message before it
        but its calls (kept, so that their results still pair)."""
        self.texts.clear()
        self.thinking.clear()
        self.attachments.clear()
        self.unknown.clear()
        self.native = True


BlockReader = Callable[[Reading, dict[str, Any], str], None]


def read_block(read: Reading, block: dict[str, Any], at: str, role: str) -> None:
    kind = block["type"]
    if kind not in BLOCK_TYPES:
        read.unknown_block(kind, block)
    elif kind not in ALLOWED[role]:
        raise InvalidSnapshot(f"{at}.type", f"unexpected block type {kind!r} for {role}")
    else:
        _READERS[kind](read, block, at)


def read_result_body(body: Any, where: str, rules: MediaRules) -> Reading:
    """A ``tool_result``'s content: a string, or a list of its blocks."""
    read = Reading(rules)
    if isinstance(body, str):
        read.texts.append(body)
        return read
    if not isinstance(body, list):
        raise InvalidSnapshot(where, "must be a string or a list of content blocks")
    check_typed(body, where, ".type")
    for k, block in enumerate(body):
        kind, at = block["type"], f"{where}[{k}]"
        if kind in RESULT_BLOCK_TYPES:
            _RESULT_READERS[kind](read, block, at)
        elif kind in BLOCK_TYPES:
            raise InvalidSnapshot(f"{at}.type", f"unexpected block type {kind!r} in a tool result")
        else:
            read.unknown_block(kind, block)
    return read


def _text(read: Reading, block: dict[str, Any], at: str) -> None:
    read.texts.append(string_field(block, "text", at))


def _thinking(read: Reading, block: dict[str, Any], at: str) -> None:
    # Its ``signature`` is opaque: carried with the block, never read.
    read.thinking.append(string_field(block, "thinking", at))


def _not_read(read: Reading, block: dict[str, Any], at: str) -> None:
    """``redacted_thinking`` (its ``data`` is encrypted) and ``fallback`` (never shown to the
    model): carried, not read."""


def _tool_use(read: Reading, block: dict[str, Any], at: str) -> None:
    read.calls.append(
        ToolCall(
            id=string_field(block, "id", at, nonempty=True),
            name=string_field(block, "name", at, nonempty=True),
            arguments=json.dumps(block.get("input", {}), ensure_ascii=False),
        )
    )


def _input_of(block: dict[str, Any], at: str) -> dict[str, Any]:
    value = block.get("input", {})
    if not isinstance(value, dict):
        raise InvalidSnapshot(f"{at}.input", "must be an object")
    return value


def _server_use(read: Reading, block: dict[str, Any], at: str) -> None:
    string_field(block, "id", at, nonempty=True)
    name = string_field(block, "name", at, nonempty=True)
    read.text(f"[server tool {name}] {readable_json(_input_of(block, at))}")


def _mcp_use(read: Reading, block: dict[str, Any], at: str) -> None:
    string_field(block, "id", at, nonempty=True)
    name = string_field(block, "name", at, nonempty=True)
    server = string_field(block, "server_name", at, nonempty=True)
    read.text(f"[mcp tool {server}/{name}] {readable_json(_input_of(block, at))}")


def _mcp_result(read: Reading, block: dict[str, Any], at: str) -> None:
    string_field(block, "tool_use_id", at, nonempty=True)
    body = block.get("content", "")
    if isinstance(body, list):
        check_typed(body, f"{at}.content")
        texts = [_text_only(b, f"{at}.content[{k}]") for k, b in enumerate(body)]
    elif isinstance(body, str):
        texts = [body]
    else:
        raise InvalidSnapshot(f"{at}.content", "must be a string or a list of text blocks")
    head = "[mcp tool error]" if block.get("is_error") is True else "[mcp tool result]"
    read.text("\n".join([head, *texts]))


def _text_only(block: dict[str, Any], at: str) -> str:
    if block["type"] != "text":
        raise InvalidSnapshot(f"{at}.type", f"unexpected block type {block['type']!r}")
    return string_field(block, "text", at)


def _server_result(read: Reading, block: dict[str, Any], at: str) -> None:
    """A server tool's result: its readable parts as text (named by the tool), its encrypted
    parts counted by the estimate (the provider bills what the model read from them)."""
    string_field(block, "tool_use_id", at, nonempty=True)
    kind = block["type"]
    tool = kind.removesuffix("_tool_result")
    lines, hidden = _result_content(block.get("content"), read.rules, read)
    read.text("\n".join([f"[{tool} result]", *lines]))
    read.opaque(f"{kind} (encrypted, not read)", hidden)


def _result_content(content: Any, rules: MediaRules, read: Reading) -> tuple[list[str], int]:
    """(readable lines, characters of encrypted payload) of a server tool result's content."""
    if isinstance(content, list):  # web search: its results
        pairs = [_web_search_result(r) for r in content if isinstance(r, dict)]
        return [line for line, _ in pairs if line], sum(n for _, n in pairs)
    if not isinstance(content, dict):
        return [], 0
    kind = _str(content.get("type"))
    if kind.endswith("_error"):
        return [_error_line(content)], 0
    reader = _RESULT_CONTENT.get(kind)
    if reader is None:  # a newer variant: named, not read
        return [f"({kind or 'unknown content'}: not read)"], 0
    return reader(content, rules, read)


def _web_search_result(result: dict[str, Any]) -> tuple[str, int]:
    """A search hit's title, URL and age; its ``encrypted_content`` is the page as the model
    reads it, opaque to us."""
    parts = [_str(result.get("title")), _str(result.get("url")), _str(result.get("page_age"))]
    line = " | ".join(p for p in parts if p)
    return (f"- {line}" if line else ""), len(_str(result.get("encrypted_content")))


def _error_line(content: dict[str, Any]) -> str:
    message = _str(content.get("error_message"))
    return f"error: {_str(content.get('error_code')) or 'unknown'}" + (
        f" ({message})" if message else ""
    )


ContentReader = Callable[[dict[str, Any], MediaRules, Reading], tuple[list[str], int]]


def _fetched(content: dict[str, Any], rules: MediaRules, read: Reading) -> tuple[list[str], int]:
    """A web fetch: the URL and the fetched document (its text, or counted as a file)."""
    head = " | ".join(p for p in (_str(content.get("url")), _str(content.get("retrieved_at"))) if p)
    doc = content.get("content")
    body = _document_text(doc, read) if isinstance(doc, dict) else ""
    return [line for line in (head, body) if line], 0


def _executed(content: dict[str, Any], rules: MediaRules, read: Reading) -> tuple[list[str], int]:
    """Code execution (also bash): return code, stdout and stderr; its output files are named
    by id only, so they are counted, not read. An encrypted stdout is opaque."""
    lines = []
    code = _int(content.get("return_code"))
    if code is not None:
        lines.append(f"return code {code}")
    for name in ("stdout", "stderr"):
        value = _str(content.get(name))
        if value:
            lines.append(f"{name}:\n{value}")
    files = content.get("content")
    if isinstance(files, list) and files:
        lines.append(f"({len(files)} output file{'s' if len(files) != 1 else ''})")
    return lines, len(_str(content.get("encrypted_stdout")))


def _viewed(content: dict[str, Any], rules: MediaRules, read: Reading) -> tuple[list[str], int]:
    first, count, total = (_int(content.get(k)) for k in ("start_line", "num_lines", "total_lines"))
    head = f"viewed {_str(content.get('file_type')) or 'a'} file"
    if first is not None and count is not None:
        head += f", lines {first}-{first + count - 1}"
    if total is not None:
        head += f" of {total}"
    return [line for line in (head, _str(content.get("content"))) if line], 0


def _created(content: dict[str, Any], rules: MediaRules, read: Reading) -> tuple[list[str], int]:
    return ["file updated" if content.get("is_file_update") is True else "file created"], 0


def _replaced(content: dict[str, Any], rules: MediaRules, read: Reading) -> tuple[list[str], int]:
    lines = content.get("lines")
    shown = [line for line in lines if isinstance(line, str)] if isinstance(lines, list) else []
    return ["str_replace", *shown], 0


def _tools_found(
    content: dict[str, Any], rules: MediaRules, read: Reading
) -> tuple[list[str], int]:
    refs = content.get("tool_references")
    names = (
        [_str(r.get("tool_name")) for r in refs if isinstance(r, dict)]
        if isinstance(refs, list)
        else []
    )
    return [f"tools: {', '.join(n for n in names if n)}"], 0


def _advised(content: dict[str, Any], rules: MediaRules, read: Reading) -> tuple[list[str], int]:
    return [_str(content.get("text"))], 0


def _advice_redacted(
    content: dict[str, Any], rules: MediaRules, read: Reading
) -> tuple[list[str], int]:
    return ["(redacted)"], len(_str(content.get("encrypted_content")))


_RESULT_CONTENT: dict[str, ContentReader] = {
    "web_fetch_result": _fetched,
    "code_execution_result": _executed,
    "encrypted_code_execution_result": _executed,
    "bash_code_execution_result": _executed,
    "text_editor_code_execution_view_result": _viewed,
    "text_editor_code_execution_create_result": _created,
    "text_editor_code_execution_str_replace_result": _replaced,
    "tool_search_tool_search_result": _tools_found,
    "advisor_result": _advised,
    "advisor_redacted_result": _advice_redacted,
}


def _compaction(read: Reading, block: dict[str, Any], at: str) -> None:
    """The provider's compaction of everything before it: its ``content`` (the summary) is
    read; ``encrypted_content``, ``signature`` and ``tool_changes`` are carried, never read.
    Null content is a failed compaction, which the API treats as a no-op: so do we."""
    content = block.get("content")
    if content is None:
        return
    if not isinstance(content, str) or not content:
        raise InvalidSnapshot(f"{at}.content", "must be a non-empty string or null")
    read.restart()
    read.texts.append(content)


def _image(read: Reading, block: dict[str, Any], at: str) -> None:
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    data = source.get("data") if source.get("type") == "base64" else None
    media_type = source.get("media_type")
    read.attachments.append(
        media.image(
            read.rules,
            data=data if isinstance(data, str) else None,
            media_type=media_type if isinstance(media_type, str) else "",
        )
    )


def _document(read: Reading, block: dict[str, Any], at: str) -> None:
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidSnapshot(f"{at}.source", "must be an object")
    if source.get("type") == "text":
        string_field(source, "data", f"{at}.source")
    read.text(_document_text(block, read))


def _document_text(block: dict[str, Any], read: Reading) -> str:
    """A document's title, context and text: a plain-text source's ``data`` and a content
    source's text blocks are its text (counted as text); a PDF (base64, URL) or an uploaded
    file is not read and counted as a file (the URL is named, the bytes and file id never)."""
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    kind = source.get("type")
    title = _str(block.get("title"))
    lines = [f"[document{': ' + title if title else ''}]", _str(block.get("context"))]
    if kind == "text":
        lines.append(_str(source.get("data")))
    elif kind == "content":
        lines.append(_source_content(source.get("content"), read))
    else:
        lines.append(_str(source.get("url")))
        media_type = _str(source.get("media_type"))
        read.attachments.append(media.file(read.rules, title or media_type or "document"))
    return "\n".join(line for line in lines if line)


def _source_content(content: Any, read: Reading) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            texts.append(_str(block.get("text")))
        elif isinstance(block, dict) and block.get("type") == "image":
            _image(read, block, "")
    return "\n".join(t for t in texts if t)


def _search_result(read: Reading, block: dict[str, Any], at: str) -> None:
    title = string_field(block, "title", at)
    source = string_field(block, "source", at)
    body = block.get("content")
    if not isinstance(body, list):
        raise InvalidSnapshot(f"{at}.content", "must be a list of text blocks")
    check_typed(body, f"{at}.content")
    texts = [_text_only(b, f"{at}.content[{k}]") for k, b in enumerate(body)]
    read.text("\n".join([f"[search result: {title} | {source}]", *texts]))


def _container_upload(read: Reading, block: dict[str, Any], at: str) -> None:
    # Its ``file_id`` is opaque: the upload is named, never the file.
    read.text("[file uploaded to the code execution container]")


def _tool_change(read: Reading, block: dict[str, Any], at: str) -> None:
    verb = "added" if block["type"] == "tool_addition" else "removed"
    read.text(f"[tool {verb}] {readable_json(block.get('tool'))}")


def _mcp_listing(read: Reading, block: dict[str, Any], at: str) -> None:
    tools = block.get("tools")
    names = (
        [_str(t.get("name")) for t in tools if isinstance(t, dict)]
        if isinstance(tools, list)
        else []
    )
    server = _str(block.get("mcp_server_name"))
    read.text(f"[mcp tools of {server}: {', '.join(n for n in names if n)}]")


def _tool_reference(read: Reading, block: dict[str, Any], at: str) -> None:
    read.text(f"[tool reference: {_str(block.get('tool_name'))}]")


def _browser_state(read: Reading, block: dict[str, Any], at: str) -> None:
    read.text(f"[browser state] {readable_json(block)}")


_READERS: dict[str, BlockReader] = {
    "text": _text,
    "thinking": _thinking,
    "redacted_thinking": _not_read,
    "fallback": _not_read,
    "tool_use": _tool_use,
    "server_tool_use": _server_use,
    "mcp_tool_use": _mcp_use,
    "mcp_tool_result": _mcp_result,
    **{kind: _server_result for kind in SERVER_RESULT_TYPES},
    "compaction": _compaction,
    "image": _image,
    "document": _document,
    "search_result": _search_result,
    "container_upload": _container_upload,
    "tool_addition": _tool_change,
    "tool_removal": _tool_change,
    "mcp_tool_listing": _mcp_listing,
}
_RESULT_READERS: dict[str, BlockReader] = {
    "text": _text,
    "image": _image,
    "document": _document,
    "search_result": _search_result,
    "tool_reference": _tool_reference,
    "browser_state": _browser_state,
}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
