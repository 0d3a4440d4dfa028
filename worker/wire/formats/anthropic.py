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

The catalogue of block types and the reader of each block are in
:mod:`worker.wire.formats.anthropic_blocks`; this module reads whole messages with them, links
server tool results across a ``pause_turn`` and renders messages back.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire.formats import anthropic_blocks
from worker.wire.formats.anthropic_blocks import (
    SERVER_BLOCKS,
    USE_OF,
    Reading,
    check_typed,
    read_block,
    read_result_body,
)
from worker.wire.formats.common import (
    normalizes_to,
    source_of,
    string_field,
)
from worker.wire.media import MediaRules
from worker.wire.models import Message, ToolCall

# The Messages API refuses a history whose first message is not a user turn.
OPENS_WITH_USER = True
# The block types this format knows, and those a tool result may hold (the catalogue is
# anthropic_blocks'; named here too, beside the format's other facts).
BLOCK_TYPES = anthropic_blocks.BLOCK_TYPES
RESULT_BLOCK_TYPES = anthropic_blocks.RESULT_BLOCK_TYPES
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
    check_typed(content, where)
    return content


def _assistant(index: int, raw: dict[str, Any], mid: str, rules: MediaRules) -> Message:
    where = f"messages[{index}].content"
    read = Reading(rules)
    for k, block in enumerate(_blocks(raw, where)):
        read_block(read, block, f"{where}[{k}]", "assistant")
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
    read = Reading(rules)
    for k, block in enumerate(_blocks(raw, where)):
        at = f"{where}[{k}]"
        if block["type"] == "tool_result":
            out.append(_tool_result(index, block, at, f"{mid}/r{len(out)}", names, rules))
        else:
            read_block(read, block, at, "user")
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
    read = read_result_body(block.get("content", ""), f"{at}.content", rules)
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
        elif kind in USE_OF:
            cid, use = str(block.get("tool_use_id")), USE_OF[kind]
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
        elif kind in SERVER_BLOCKS:
            pair = str(b.get("id") if kind in USE_OF.values() else b.get("tool_use_id"))
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
        if kind in USE_OF:
            results.add(str(b.get("tool_use_id")))
        elif kind in SERVER_BLOCKS:
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
    read = Reading(MediaRules(provider="anthropic"))
    try:
        check_typed(blocks, "content")
        for block in blocks:
            read_block(read, block, "content", "user")
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
                text = "\n".join(read_result_body(b.get("content", ""), "", MediaRules()).texts)
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
