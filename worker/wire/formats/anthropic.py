"""Anthropic Messages: every content block type of the Messages API, GA and beta
(:data:`BLOCK_TYPES`), read into the internal model and carried back byte for byte.

A user message that carries tool results becomes one internal ``tool`` message per result,
followed by a ``user`` message for any text it also carries; all of them keep the wire message's
``source_index``, so grouping never splits one wire message.

What is readable (text, thinking text, a server tool's name and input, the titles, URLs and
page text of its results, a document's text) goes into the message's text; what is opaque
(signatures, encrypted content, base64 data, file and object ids) is never read, only carried.
Server tools (web search, web fetch, code execution, tool search, MCP) run inside one assistant
turn: each result answers a use earlier in the same assistant message or in the one just before
it (a ``pause_turn`` continuation, then kept in one group with it: :func:`link`). A
``compaction`` block with content is the provider's own compaction of everything before it.
A block of a type this module does not know is accepted, carried, never read, and counted by
the conservative estimate (``Message.unknown_types``).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire import media
from worker.wire.formats.common import (
    normalizes_to,
    readable_json,
    source_of,
    string_field,
    unknown_payload,
)
from worker.wire.media import Attachment, MediaRules
from worker.wire.models import Message, ToolCall

# The Messages API refuses a history whose first message is not a user turn.
OPENS_WITH_USER = True

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
_USE_OF = {kind: "server_tool_use" for kind in SERVER_RESULT_TYPES} | {
    "mcp_tool_result": "mcp_tool_use"
}
_SERVER_BLOCKS = frozenset({*_USE_OF, *_USE_OF.values()})
# Where the API puts each block: what the model produced (thinking, its calls, the server
# tools it ran, a compaction) only in assistant turns, a client tool's result only in user
# turns, the rest in either.
_ASSISTANT_ONLY = frozenset(
    {"thinking", "tool_use", "compaction", "fallback", "mcp_tool_listing", *_SERVER_BLOCKS}
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
_ALLOWED = {"assistant": _ASSISTANT_ONLY | _EITHER, "user": _USER_ONLY | _EITHER}
# The system prompt's blocks: text is read; these few were always let through unread.
_SYSTEM_SKIPPED = frozenset({"image", "document", "redacted_thinking", "search_result"})


def system_messages(system: Any) -> list[Message]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _system_text(system)
    return [Message(id="system", role="system", content=text, source_index=-1)]


def _system_text(blocks: Any) -> str:
    if not isinstance(blocks, list):
        raise InvalidSnapshot("system", "must be a string or a list of content blocks")
    texts = []
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise InvalidSnapshot(f"system[{k}].type", "a content block needs a string 'type'")
        if kind == "text":
            texts.append(string_field(block, "text", f"system[{k}]"))
        elif kind not in _SYSTEM_SKIPPED:
            raise InvalidSnapshot(f"system[{k}].type", f"unexpected block type {kind!r}")
    return "\n".join(texts)


# Blocks read as strings only (or not at all): equal (``==``) blocks always read the same. The
# others render JSON or numbers into text (key order, 1 vs 1.0 vs true show there), or are
# counted by their JSON's length.
_PLAIN_BLOCKS = frozenset(
    {
        "text",
        "thinking",
        "redacted_thinking",
        "image",
        "document",
        "search_result",
        "container_upload",
        "compaction",
        "fallback",
    }
)
_PLAIN_RESULT_BLOCKS = frozenset({"text", "image", "document", "search_result", "tool_reference"})


def reusable(raw: dict[str, Any]) -> bool:
    """Whether an equal (``==``) wire message always normalizes to the same message."""
    content = raw.get("content")
    return not isinstance(content, list) or all(map(_plain_block, content))


def _plain_block(block: Any) -> bool:
    if not isinstance(block, dict):
        return True  # refused when read, whatever it equals
    kind = block.get("type")
    if kind != "tool_result":
        return kind in _PLAIN_BLOCKS
    body = block.get("content")
    return not isinstance(body, list) or all(
        isinstance(b, dict) and b.get("type") in _PLAIN_RESULT_BLOCKS for b in body
    )


def wire_message(
    index: int,
    raw: dict[str, Any],
    mid: str,
    names: dict[str, str],
    rules: MediaRules | None = None,
) -> list[Message]:
    """The internal messages of one wire message; ``names`` maps earlier call ids to tools."""
    role = raw.get("role")
    rules = rules or MediaRules(provider="anthropic")
    if role == "assistant":
        return [_assistant(index, raw, mid, rules)]
    if role == "user":
        return _user(index, raw, mid, names, rules)
    raise InvalidSnapshot(f"messages[{index}].role", f"unknown role {role!r}")


def _blocks(raw: dict[str, Any], where: str) -> list[dict[str, Any]]:
    content = raw.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidSnapshot(where, "must be a string or a list of content blocks")
    _check_typed(content, where)
    return content


def _check_typed(blocks: list[Any], where: str, field: str = "") -> None:
    """Every block an object with a string ``type``; the error names ``where[k]`` (with
    ``field`` after it: nested blocks have always named their ``.type``)."""
    for k, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidSnapshot(f"{where}[{k}]{field}", "a content block needs a string 'type'")


# --- reading blocks ------------------------------------------------------------------------------


@dataclass
class _Read:
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


BlockReader = Callable[[_Read, dict[str, Any], str], None]


def _read_block(read: _Read, block: dict[str, Any], at: str, role: str) -> None:
    kind = block["type"]
    if kind not in BLOCK_TYPES:
        read.unknown_block(kind, block)
    elif kind not in _ALLOWED[role]:
        raise InvalidSnapshot(f"{at}.type", f"unexpected block type {kind!r} for {role}")
    else:
        _READERS[kind](read, block, at)


def _assistant(index: int, raw: dict[str, Any], mid: str, rules: MediaRules) -> Message:
    where = f"messages[{index}].content"
    read = _Read(rules)
    for k, block in enumerate(_blocks(raw, where)):
        _read_block(read, block, f"{where}[{k}]", "assistant")
    return Message(
        id=mid,
        role="assistant",
        content="\n".join(read.texts),
        reasoning="\n".join(read.thinking),
        tool_calls=tuple(read.calls),
        source_index=index,
        attachments=tuple(read.attachments),
        native_compaction=read.native,
        unknown_types=tuple(read.unknown),
    )


def _user(
    index: int, raw: dict[str, Any], mid: str, names: dict[str, str], rules: MediaRules
) -> list[Message]:
    """Tool results first (one message each, with the images of their content), then the
    text, images and documents of the rest as one user message."""
    where = f"messages[{index}].content"
    out: list[Message] = []
    read = _Read(rules)
    for k, block in enumerate(_blocks(raw, where)):
        at = f"{where}[{k}]"
        if block["type"] == "tool_result":
            out.append(_tool_result(index, block, at, f"{mid}/r{len(out)}", names, rules))
        else:
            _read_block(read, block, at, "user")
    if read.texts or read.attachments or not out:
        out.append(
            Message(
                id=f"{mid}/t" if out else mid,
                role="user",
                content="\n".join(read.texts),
                source_index=index,
                attachments=tuple(read.attachments),
                unknown_types=tuple(read.unknown),
            )
        )
    return out


def _tool_result(
    index: int,
    block: dict[str, Any],
    at: str,
    rid: str,
    names: dict[str, str],
    rules: MediaRules,
) -> Message:
    cid = string_field(block, "tool_use_id", at, nonempty=True)
    read = _read_result_body(block.get("content", ""), f"{at}.content", rules)
    return Message(
        id=rid,
        role="tool",
        content="\n".join(read.texts),
        tool_call_id=cid,
        tool_name=names.get(cid),
        source_index=index,
        attachments=tuple(read.attachments),
        unknown_types=tuple(read.unknown),
    )


def _read_result_body(body: Any, where: str, rules: MediaRules) -> _Read:
    """A ``tool_result``'s content: a string, or a list of its blocks."""
    read = _Read(rules)
    if isinstance(body, str):
        read.texts.append(body)
        return read
    if not isinstance(body, list):
        raise InvalidSnapshot(where, "must be a string or a list of content blocks")
    _check_typed(body, where, ".type")
    for k, block in enumerate(body):
        kind, at = block["type"], f"{where}[{k}]"
        if kind in RESULT_BLOCK_TYPES:
            _RESULT_READERS[kind](read, block, at)
        elif kind in BLOCK_TYPES:
            raise InvalidSnapshot(f"{at}.type", f"unexpected block type {kind!r} in a tool result")
        else:
            read.unknown_block(kind, block)
    return read


def _text(read: _Read, block: dict[str, Any], at: str) -> None:
    read.texts.append(string_field(block, "text", at))


def _thinking(read: _Read, block: dict[str, Any], at: str) -> None:
    # Its ``signature`` is opaque: carried with the block, never read.
    read.thinking.append(string_field(block, "thinking", at))


def _not_read(read: _Read, block: dict[str, Any], at: str) -> None:
    """``redacted_thinking`` (its ``data`` is encrypted) and ``fallback`` (never shown to the
    model): carried, not read."""


def _tool_use(read: _Read, block: dict[str, Any], at: str) -> None:
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


def _server_use(read: _Read, block: dict[str, Any], at: str) -> None:
    string_field(block, "id", at, nonempty=True)
    name = string_field(block, "name", at, nonempty=True)
    read.text(f"[server tool {name}] {readable_json(_input_of(block, at))}")


def _mcp_use(read: _Read, block: dict[str, Any], at: str) -> None:
    string_field(block, "id", at, nonempty=True)
    name = string_field(block, "name", at, nonempty=True)
    server = string_field(block, "server_name", at, nonempty=True)
    read.text(f"[mcp tool {server}/{name}] {readable_json(_input_of(block, at))}")


def _mcp_result(read: _Read, block: dict[str, Any], at: str) -> None:
    string_field(block, "tool_use_id", at, nonempty=True)
    body = block.get("content", "")
    if isinstance(body, list):
        _check_typed(body, f"{at}.content")
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


def _server_result(read: _Read, block: dict[str, Any], at: str) -> None:
    """A server tool's result: its readable parts as text (named by the tool), its encrypted
    parts counted by the estimate (the provider bills what the model read from them)."""
    string_field(block, "tool_use_id", at, nonempty=True)
    kind = block["type"]
    tool = kind.removesuffix("_tool_result")
    lines, hidden = _result_content(block.get("content"), read.rules, read)
    read.text("\n".join([f"[{tool} result]", *lines]))
    read.opaque(f"{kind} (encrypted, not read)", hidden)


def _result_content(content: Any, rules: MediaRules, read: _Read) -> tuple[list[str], int]:
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


ContentReader = Callable[[dict[str, Any], MediaRules, _Read], tuple[list[str], int]]


def _fetched(content: dict[str, Any], rules: MediaRules, read: _Read) -> tuple[list[str], int]:
    """A web fetch: the URL and the fetched document (its text, or counted as a file)."""
    head = " | ".join(p for p in (_str(content.get("url")), _str(content.get("retrieved_at"))) if p)
    doc = content.get("content")
    body = _document_text(doc, read) if isinstance(doc, dict) else ""
    return [line for line in (head, body) if line], 0


def _executed(content: dict[str, Any], rules: MediaRules, read: _Read) -> tuple[list[str], int]:
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


def _viewed(content: dict[str, Any], rules: MediaRules, read: _Read) -> tuple[list[str], int]:
    first, count, total = (_int(content.get(k)) for k in ("start_line", "num_lines", "total_lines"))
    head = f"viewed {_str(content.get('file_type')) or 'a'} file"
    if first is not None and count is not None:
        head += f", lines {first}-{first + count - 1}"
    if total is not None:
        head += f" of {total}"
    return [line for line in (head, _str(content.get("content"))) if line], 0


def _created(content: dict[str, Any], rules: MediaRules, read: _Read) -> tuple[list[str], int]:
    return ["file updated" if content.get("is_file_update") is True else "file created"], 0


def _replaced(content: dict[str, Any], rules: MediaRules, read: _Read) -> tuple[list[str], int]:
    lines = content.get("lines")
    shown = [line for line in lines if isinstance(line, str)] if isinstance(lines, list) else []
    return ["str_replace", *shown], 0


def _tools_found(content: dict[str, Any], rules: MediaRules, read: _Read) -> tuple[list[str], int]:
    refs = content.get("tool_references")
    names = (
        [_str(r.get("tool_name")) for r in refs if isinstance(r, dict)]
        if isinstance(refs, list)
        else []
    )
    return [f"tools: {', '.join(n for n in names if n)}"], 0


def _advised(content: dict[str, Any], rules: MediaRules, read: _Read) -> tuple[list[str], int]:
    return [_str(content.get("text"))], 0


def _advice_redacted(
    content: dict[str, Any], rules: MediaRules, read: _Read
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


def _compaction(read: _Read, block: dict[str, Any], at: str) -> None:
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


def _image(read: _Read, block: dict[str, Any], at: str) -> None:
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


def _document(read: _Read, block: dict[str, Any], at: str) -> None:
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidSnapshot(f"{at}.source", "must be an object")
    if source.get("type") == "text":
        string_field(source, "data", f"{at}.source")
    read.text(_document_text(block, read))


def _document_text(block: dict[str, Any], read: _Read) -> str:
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


def _source_content(content: Any, read: _Read) -> str:
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


def _search_result(read: _Read, block: dict[str, Any], at: str) -> None:
    title = string_field(block, "title", at)
    source = string_field(block, "source", at)
    body = block.get("content")
    if not isinstance(body, list):
        raise InvalidSnapshot(f"{at}.content", "must be a list of text blocks")
    _check_typed(body, f"{at}.content")
    texts = [_text_only(b, f"{at}.content[{k}]") for k, b in enumerate(body)]
    read.text("\n".join([f"[search result: {title} | {source}]", *texts]))


def _container_upload(read: _Read, block: dict[str, Any], at: str) -> None:
    # Its ``file_id`` is opaque: the upload is named, never the file.
    read.text("[file uploaded to the code execution container]")


def _tool_change(read: _Read, block: dict[str, Any], at: str) -> None:
    verb = "added" if block["type"] == "tool_addition" else "removed"
    read.text(f"[tool {verb}] {readable_json(block.get('tool'))}")


def _mcp_listing(read: _Read, block: dict[str, Any], at: str) -> None:
    tools = block.get("tools")
    names = (
        [_str(t.get("name")) for t in tools if isinstance(t, dict)]
        if isinstance(tools, list)
        else []
    )
    server = _str(block.get("mcp_server_name"))
    read.text(f"[mcp tools of {server}: {', '.join(n for n in names if n)}]")


def _tool_reference(read: _Read, block: dict[str, Any], at: str) -> None:
    read.text(f"[tool reference: {_str(block.get('tool_name'))}]")


def _browser_state(read: _Read, block: dict[str, Any], at: str) -> None:
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


# --- server tools across a pause_turn ------------------------------------------------------------


def link(
    raw_messages: list[dict[str, Any]], messages: list[Message], start: int = 0
) -> list[Message]:
    """Check that every server tool result (``*_tool_result``, ``mcp_tool_result``) answers a
    use earlier in its assistant message, or in the assistant message just before it (the API
    ended that one with ``pause_turn`` and continued in the next), once; mark that earlier
    message ``joins_next``, so that a compaction never separates the two. A use still without
    a result is fine. ``messages``: the normalized ``raw_messages``; wire messages before
    ``start`` were linked already (by the parse they are reused from). Returns ``messages``,
    copied only where a mark changes."""
    continued = []
    earlier = _served(raw_messages[start - 1], start - 1, None).open if start > 0 else {}
    for index in range(start, len(raw_messages)):
        current = _served(raw_messages[index], index, earlier)
        if current.continues:
            continued.append(index - 1)
        earlier = current.open
    return _joined(messages, continued)


@dataclass
class _Served:
    """The server tool uses of one assistant message not answered in it, by id -> type."""

    open: dict[str, str] = field(default_factory=dict)
    continues: bool = False  # a result in it answers a use of the message before


def _served(raw: dict[str, Any], index: int, earlier: dict[str, str] | None) -> _Served:
    """The uses and results of wire message ``index``, each result checked against the uses
    before it there and then the still open ``earlier`` ones (taking them); ``earlier`` None:
    checked already."""
    content = raw.get("content")
    served = _Served()
    if raw.get("role") != "assistant" or not isinstance(content, list):
        return served
    for k, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("server_tool_use", "mcp_tool_use"):
            cid = str(block.get("id"))
            if cid in served.open and earlier is not None:
                where = f"messages[{index}].content[{k}].id"
                raise InvalidSnapshot(where, f"duplicate {kind} id {cid!r}")
            served.open[cid] = kind
        elif kind in _USE_OF:
            cid, use = str(block.get("tool_use_id")), _USE_OF[kind]
            if served.open.get(cid) == use:
                del served.open[cid]
            elif earlier is None:
                continue
            elif earlier.get(cid) == use:
                del earlier[cid]
                served.continues = True
            else:
                raise InvalidSnapshot(
                    f"messages[{index}].content[{k}].tool_use_id",
                    f"{kind} {cid!r} answers no {use} earlier in this assistant turn (this "
                    "message or the assistant message just before it), or answers it twice",
                )
    return served


def _joined(messages: list[Message], sources: list[int]) -> list[Message]:
    """``messages`` with the ones normalized from the wire messages ``sources`` (assistant
    messages: exactly one each) marked ``joins_next``; copied only where a mark changes."""
    out = messages
    for source_index in sources:
        i = bisect.bisect_left(messages, source_index, key=lambda m: m.source_index)
        if i < len(messages) and not messages[i].joins_next:
            out = list(messages) if out is messages else out
            out[i] = messages[i].model_copy(update={"joins_next": True})
    return out


# --- rendering -----------------------------------------------------------------------------------


def render(
    messages: list[Message], *, with_ids: bool, source: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Consecutive tool results share one user message, as the Messages API expects. With the
    ``source`` wire messages, what a carried message did not change is copied from its source
    (the whole message; a tool result's block, images included; a user turn's blocks), and a
    message holding a ``compaction`` block always is (the API refuses one with any field it
    did not return). A changed turn keeps every block it cannot rebuild, in order."""
    out: list[dict[str, Any]] = []
    rendered = {m.source_index for m in messages}
    for m in messages:
        whole = source_of(m, source)
        if m.role != "tool" and whole is not None and _carried_whole(m, whole):
            carried = _unsigned(whole) if m.role == "assistant" else dict(whole)
            out.append({"id": m.id, **carried} if with_ids and "id" not in carried else carried)
            continue
        src = _source_blocks(m, source)
        if m.role == "tool":
            block = _result_block(m, src)
            if out and out[-1]["role"] == "user" and out[-1].get("_results"):
                out[-1]["content"].append(block)
                continue
            out.append(_wire(m, "user", [block], with_ids) | {"_results": True})
            continue
        if m.role == "assistant":
            blocks = _assistant_blocks(m, src, _partners(source, m.source_index), rendered)
        else:
            blocks = _user_blocks(m, src)
        role = "assistant" if m.role == "assistant" else "user"
        out.append(_wire(m, role, blocks or [{"type": "text", "text": ""}], with_ids))
    for raw in out:
        raw.pop("_results", None)
    return out


def _unsigned(whole: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn carried into a replacement, as it was but for its thinking: a carried
    turn always follows the summary, so the history before its thinking blocks is not the one
    they were made after, and a model that binds thinking to what precedes it refuses them
    (see :data:`_REBUILT_BLOCKS`). A message holding a provider compaction goes exactly as it
    was (the API refuses one with any change)."""
    content = whole.get("content")
    if _holds_compaction(whole) or not isinstance(content, list):
        return dict(whole)
    kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in _THINKING)]
    if len(kept) == len(content):
        return dict(whole)
    return {**whole, "content": kept or [{"type": "text", "text": ""}]}


_THINKING = frozenset({"thinking", "redacted_thinking"})


def _carried_whole(m: Message, whole: dict[str, Any]) -> bool:
    if _holds_compaction(whole):
        return True

    def alone(
        index: int, raw: dict[str, Any], mid: str, names: dict[str, str], rules: MediaRules
    ) -> Message:
        # What the history around a message decided (a pause_turn continuation, a native
        # compaction after it) is not the message's own: compared as ``m`` has it.
        fresh = _alone(index, raw, mid, names, rules)
        return fresh.model_copy(update={"joins_next": m.joins_next, "superseded": m.superseded})

    return normalizes_to(m, whole, alone)


def _holds_compaction(raw: dict[str, Any]) -> bool:
    content = raw.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "compaction" for b in content
    )


def _alone(
    index: int, raw: dict[str, Any], mid: str, names: dict[str, str], rules: MediaRules
) -> Message:
    """The one message ``raw`` normalizes to; refused when tool results sit beside it (such a
    wire message is not ``m`` alone, so it cannot be carried whole)."""
    fresh = wire_message(index, raw, mid, names, rules)
    if len(fresh) != 1:
        raise InvalidSnapshot(f"messages[{index}]", "holds more than one message")
    return fresh[0]


# Rebuilt from the message itself when it changed: its text (``m.content``). Its thinking is
# dropped, by Anthropic's rules for thinking blocks across turns ("Preserving thinking
# blocks"): a thinking or redacted_thinking block is valid only in the unchanged assistant
# message it came in, after an unchanged history (its signature covers both; a modified
# block, a rebuilt message or a filtered redacted_thinking block is refused), while thinking
# may be omitted from earlier assistant turns. A rewritten turn is always an earlier one (the
# newest is in the protected tail), so it goes without its thinking rather than with a
# signature that no longer covers it.
_REBUILT_BLOCKS = frozenset({"text", "thinking", "redacted_thinking"})


def _assistant_blocks(
    m: Message, src: list[dict[str, Any]], partners: dict[str, int], rendered: set[int]
) -> list[dict[str, Any]]:
    """A changed assistant turn: its text, then its source's blocks in order, the carried
    calls as they are now, a server tool's use and result only while both are carried, and
    every other block as it was (documents, uploads, unknown blocks, ...); no thinking."""
    calls = {c.id: c for c in m.tool_calls}
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    for b in src:
        kind = b.get("type")
        if kind in _REBUILT_BLOCKS:
            continue
        if kind == "tool_use":
            call = calls.pop(str(b.get("id")), None)
            if call is not None:
                blocks.append(_call_block(b, call))
        elif kind in _SERVER_BLOCKS:
            pair = str(b.get("id") if kind in _USE_OF.values() else b.get("tool_use_id"))
            if partners.get(pair) in rendered:
                blocks.append(b)
        else:
            blocks.append(b)
    blocks += [_call_block({"type": "tool_use", "id": c.id}, c) for c in calls.values()]
    return blocks


def _call_block(b: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """The source's ``tool_use`` block (its ``caller``, ``cache_control`` and all) with the
    call's name and arguments; as it was when they did not change."""
    if call.name == b.get("name") and call.arguments == json.dumps(
        b.get("input", {}), ensure_ascii=False
    ):
        return dict(b)
    return {**b, "name": call.name, "input": _input(call.arguments)}


def _partners(source: list[dict[str, Any]] | None, index: int) -> dict[str, int]:
    """For each server tool use or result of wire message ``index``, by its id: the wire
    message its other half is in (this one, the one before or the one after it)."""
    if source is None or not 0 <= index < len(source):
        return {}
    uses, results = _server_ids(source, index)
    before_uses, _ = _server_ids(source, index - 1)
    _, after_results = _server_ids(source, index + 1)
    found: dict[str, int] = {}
    for cid in uses:
        if cid in results or cid in after_results:
            found[cid] = index if cid in results else index + 1
    for cid in results:
        if cid in uses or cid in before_uses:
            found[cid] = index if cid in uses else index - 1
    return found


def _server_ids(source: list[dict[str, Any]], index: int) -> tuple[set[str], set[str]]:
    """(use ids, answered ids) of the server tool blocks of assistant message ``index``."""
    raw = source[index] if 0 <= index < len(source) else None
    content = raw.get("content") if isinstance(raw, dict) and raw.get("role") == "assistant" else []
    uses, results = set(), set()
    for b in content if isinstance(content, list) else []:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind in _USE_OF:
            results.add(str(b.get("tool_use_id")))
        elif kind in _SERVER_BLOCKS:
            uses.add(str(b.get("id")))
    return uses, results


def _user_blocks(m: Message, src: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user turn: its source's blocks when its text is unchanged; else the new text, then
    every block of the source but its text and tool results (images, documents, ...)."""
    own = [b for b in src if b.get("type") != "tool_result"]
    if own and _user_text(own) == m.content:
        return own  # unchanged: as it was
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    return blocks + [b for b in own if b.get("type") != "text"]


def _user_text(blocks: list[dict[str, Any]]) -> str | None:
    """The text a user turn of these blocks reads (None: they do not read)."""
    read = _Read(MediaRules(provider="anthropic"))
    try:
        _check_typed(blocks, "content")
        for block in blocks:
            _read_block(read, block, "content", "user")
    except InvalidSnapshot:
        return None
    return "\n".join(read.texts)


def _source_blocks(m: Message, source: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    src = source_of(m, source)
    content = src.get("content") if src is not None else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _result_block(m: Message, src: list[dict[str, Any]]) -> dict[str, Any]:
    """The source's ``tool_result`` block when the result is unchanged, else the same block
    (``is_error``, ``cache_control`` and all) with the new text as its content."""
    for b in src:
        if b.get("type") == "tool_result" and b.get("tool_use_id") == m.tool_call_id:
            try:
                text = "\n".join(_read_result_body(b.get("content", ""), "", MediaRules()).texts)
            except InvalidSnapshot:
                text = None
            if text == m.content:
                return dict(b)
            return {**{k: v for k, v in b.items() if k != "content"}, "content": m.content}
    return {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}


def _wire(m: Message, role: str, blocks: list[dict[str, Any]], with_ids: bool) -> dict[str, Any]:
    raw: dict[str, Any] = {"id": m.id} if with_ids else {}
    raw.update(role=role, content=blocks)
    return raw


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {"_raw": arguments}


def text_message(role: str, text: str, *, msg_id: str | None) -> dict[str, Any]:
    raw: dict[str, Any] = {"id": msg_id} if msg_id else {}
    raw.update(
        role="user" if role != "assistant" else role, content=[{"type": "text", "text": text}]
    )
    return raw


def replace_tool_results(
    raw_messages: list[dict[str, Any]], bodies: dict[str, str]
) -> list[dict[str, Any]]:
    out = []
    for raw in raw_messages:
        content = raw.get("content")
        if raw.get("role") != "user" or not isinstance(content, list):
            out.append(raw)
            continue
        blocks = [
            {**b, "content": bodies[b["tool_use_id"]]}
            if b.get("type") == "tool_result" and b.get("tool_use_id") in bodies
            else b
            for b in content
        ]
        out.append({**raw, "content": blocks})
    return out
