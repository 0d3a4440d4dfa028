"""Anthropic Messages: content blocks ``text``, ``tool_use``, ``tool_result``, ``thinking``.

A user message that carries tool results becomes one internal ``tool`` message per result,
followed by a ``user`` message for any text it also carries; all of them keep the wire message's
``source_index``, so grouping never splits one wire message.
"""

from __future__ import annotations

import json
from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire import media
from worker.wire.formats.common import normalizes_to, source_of, string_field
from worker.wire.media import Attachment, MediaRules
from worker.wire.models import Message, ToolCall

# The Messages API refuses a history whose first message is not a user turn.
OPENS_WITH_USER = True

_PLACEHOLDER_BLOCKS = {"image", "document", "redacted_thinking", "search_result"}


def system_messages(system: Any) -> list[Message]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _texts(system, "system", allow=())
    return [Message(id="system", role="system", content=text, source_index=-1)]


def reusable(raw: dict[str, Any]) -> bool:
    """Whether an equal (``==``) wire message always normalizes to the same message. Not with a
    ``tool_use`` block: its input becomes JSON text, in which key order and 1 vs 1.0 vs true
    show, though Python's ``==`` ignores them."""
    content = raw.get("content")
    return not isinstance(content, list) or not any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in content
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
    if role == "assistant":
        return [_assistant(index, raw, mid)]
    if role == "user":
        return _user(index, raw, mid, names, rules or MediaRules(provider="anthropic"))
    raise InvalidSnapshot(f"messages[{index}].role", f"unknown role {role!r}")


def _blocks(raw: dict[str, Any], where: str) -> list[dict[str, Any]]:
    content = raw.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidSnapshot(where, "must be a string or a list of content blocks")
    for k, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidSnapshot(f"{where}[{k}]", "a content block needs a string 'type'")
    return content


def _texts(blocks: Any, where: str, *, allow: tuple[str, ...]) -> str:
    if not isinstance(blocks, list):
        raise InvalidSnapshot(where, "must be a string or a list of content blocks")
    texts = []
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise InvalidSnapshot(f"{where}[{k}].type", "a content block needs a string 'type'")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise InvalidSnapshot(f"{where}[{k}].text", "must be a string")
            texts.append(block["text"])
        elif kind not in _PLACEHOLDER_BLOCKS and kind not in allow:
            raise InvalidSnapshot(f"{where}[{k}].type", f"unexpected block type {kind!r}")
    return "\n".join(texts)


def _assistant(index: int, raw: dict[str, Any], mid: str) -> Message:
    where = f"messages[{index}].content"
    texts, thinking, calls = [], [], []
    for k, block in enumerate(_blocks(raw, where)):
        kind, at = block["type"], f"{where}[{k}]"
        if kind == "text":
            texts.append(string_field(block, "text", at))
        elif kind == "thinking":
            thinking.append(string_field(block, "thinking", at))
        elif kind == "tool_use":
            calls.append(
                ToolCall(
                    id=string_field(block, "id", at, nonempty=True),
                    name=string_field(block, "name", at, nonempty=True),
                    arguments=json.dumps(block.get("input", {}), ensure_ascii=False),
                )
            )
        elif kind not in _PLACEHOLDER_BLOCKS:
            raise InvalidSnapshot(f"{at}.type", f"unexpected block type {kind!r} for assistant")
    return Message(
        id=mid,
        role="assistant",
        content="\n".join(texts),
        reasoning="\n".join(thinking),
        tool_calls=tuple(calls),
        source_index=index,
    )


def _user(
    index: int, raw: dict[str, Any], mid: str, names: dict[str, str], rules: MediaRules
) -> list[Message]:
    """Tool results first (one message each, with the images of their content), then the
    text, images and documents of the rest as one user message."""
    where = f"messages[{index}].content"
    out: list[Message] = []
    texts: list[str] = []
    blocks = _blocks(raw, where)
    for k, block in enumerate(blocks):
        kind, at = block["type"], f"{where}[{k}]"
        if kind == "tool_result":
            cid = string_field(block, "tool_use_id", at, nonempty=True)
            body = block.get("content", "")
            text = body if isinstance(body, str) else _texts(body, f"{at}.content", allow=())
            out.append(
                Message(
                    id=f"{mid}/r{len(out)}",
                    role="tool",
                    content=text,
                    tool_call_id=cid,
                    tool_name=names.get(cid),
                    source_index=index,
                    attachments=_attachments(body, rules),
                )
            )
        elif kind == "text":
            texts.append(string_field(block, "text", at))
        elif kind not in _PLACEHOLDER_BLOCKS:
            raise InvalidSnapshot(f"{at}.type", f"unexpected block type {kind!r} for user")
    attachments = _attachments(blocks, rules)
    if texts or attachments or not out:
        user_id = f"{mid}/t" if out else mid
        out.append(
            Message(
                id=user_id,
                role="user",
                content="\n".join(texts),
                source_index=index,
                attachments=attachments,
            )
        )
    return out


def _attachments(blocks: Any, rules: MediaRules) -> tuple[Attachment, ...]:
    """The ``image`` and ``document`` blocks of checked blocks (a tool result's inside its
    own)."""
    if not isinstance(blocks, list):
        return ()
    out = []
    for block in blocks:
        kind = block.get("type")
        source = block.get("source")
        source = source if isinstance(source, dict) else {}
        if kind == "image":
            data = source.get("data") if source.get("type") == "base64" else None
            media_type = source.get("media_type")
            out.append(
                media.image(
                    rules,
                    data=data if isinstance(data, str) else None,
                    media_type=media_type if isinstance(media_type, str) else "",
                )
            )
        elif kind == "document":
            title = block.get("title") or source.get("media_type")
            out.append(media.file(rules, title if isinstance(title, str) else "document"))
    return tuple(out)


def render(
    messages: list[Message], *, with_ids: bool, source: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Consecutive tool results share one user message, as the Messages API expects. With the
    ``source`` wire messages, what a carried message did not change is copied from its source
    (a tool result's block, images included; a user turn's blocks); a changed user turn keeps
    the source's image and document blocks after its new text."""
    out: list[dict[str, Any]] = []
    for m in messages:
        whole = source_of(m, source)
        if m.role != "tool" and whole is not None and normalizes_to(m, whole, _alone):
            out.append({"id": m.id, **whole} if with_ids and "id" not in whole else dict(whole))
            continue
        src = _source_blocks(m, source)
        if m.role == "tool":
            block = _result_block(m, src)
            if out and out[-1]["role"] == "user" and out[-1].get("_results"):
                out[-1]["content"].append(block)
                continue
            out.append(_wire(m, "user", [block], with_ids) | {"_results": True})
            continue
        blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        if m.role == "user" and src:
            own = [b for b in src if b.get("type") != "tool_result"]
            texts = [b for b in own if b.get("type") == "text"]
            if "\n".join(str(b.get("text")) for b in texts) == m.content:
                blocks = own  # unchanged: as it was
            else:
                blocks += [b for b in own if b.get("type") in _MEDIA_BLOCKS]
        blocks += [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)}
            for c in m.tool_calls
        ]
        role = "assistant" if m.role == "assistant" else "user"
        out.append(_wire(m, role, blocks or [{"type": "text", "text": ""}], with_ids))
    for raw in out:
        raw.pop("_results", None)
    return out


_MEDIA_BLOCKS = {"image", "document"}


def _alone(
    index: int, raw: dict[str, Any], mid: str, names: dict[str, str], rules: MediaRules
) -> Message:
    """The one message ``raw`` normalizes to; refused when tool results sit beside it (such a
    wire message is not ``m`` alone, so it cannot be carried whole)."""
    fresh = wire_message(index, raw, mid, names, rules)
    if len(fresh) != 1:
        raise InvalidSnapshot(f"messages[{index}]", "holds more than one message")
    return fresh[0]


def _source_blocks(m: Message, source: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    src = source_of(m, source)
    content = src.get("content") if src is not None else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _result_block(m: Message, src: list[dict[str, Any]]) -> dict[str, Any]:
    """The source's ``tool_result`` block when the result is unchanged, else a new one."""
    for b in src:
        if b.get("type") == "tool_result" and b.get("tool_use_id") == m.tool_call_id:
            body = b.get("content", "")
            try:
                text = body if isinstance(body, str) else _texts(body, "content", allow=())
            except InvalidSnapshot:
                break
            if text == m.content:
                return dict(b)
            break
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
