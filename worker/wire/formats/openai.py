"""OpenAI Chat Completions messages."""

from __future__ import annotations

from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire import media
from worker.wire.formats.common import normalizes_to, source_of, string_field
from worker.wire.media import Attachment, MediaRules
from worker.wire.models import Message, ToolCall

# Chat Completions takes a history opening with any role after the system messages.
OPENS_WITH_USER = False

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


# Chat Completions content parts; text and refusals carry text we count, images and files are
# counted as attachments (worker.wire.media), audio passes through uncounted.
_PART_TYPES = {"text", "refusal", "image_url", "input_audio", "file"}
_TEXT_PART_TYPES = {"text", "refusal"}


def system_messages(system: Any) -> list[Message]:
    if system is not None:
        raise InvalidSnapshot("system", "only the anthropic format has a top-level system")
    return []


def reusable(raw: dict[str, Any]) -> bool:
    """Whether an equal (``==``) wire message always normalizes to the same message: here
    always, as every field read is a string, and strings only equal strings."""
    del raw
    return True


def wire_message(
    index: int,
    raw: dict[str, Any],
    mid: str,
    names: dict[str, str],
    rules: MediaRules | None = None,
) -> list[Message]:
    """The internal message of one wire message; ``names`` maps earlier call ids to tools."""
    return [_message(index, raw, mid, names, rules or MediaRules())]


def _message(
    index: int, raw: dict[str, Any], mid: str, names: dict[str, str], rules: MediaRules
) -> Message:
    where = f"messages[{index}]"
    role = raw.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidSnapshot(f"{where}.role", f"unknown role {role!r}")
    content = _text(raw.get("content"), f"{where}.content")
    attachments = _attachments(raw.get("content"), rules)
    reasoning = raw.get("reasoning_content") or raw.get("reasoning") or ""
    if not isinstance(reasoning, str):
        raise InvalidSnapshot(f"{where}.reasoning_content", "must be a string")
    calls = _tool_calls(raw.get("tool_calls"), where) if role == "assistant" else ()
    if role != "assistant" and raw.get("tool_calls"):
        raise InvalidSnapshot(f"{where}.tool_calls", f"a {role} message cannot call tools")
    call_id = None
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidSnapshot(f"{where}.tool_call_id", "a tool message needs a tool_call_id")
    return Message(
        id=mid,
        role=_ROLES[role],
        content=content,
        reasoning=reasoning,
        tool_calls=calls,
        tool_call_id=call_id,
        tool_name=names.get(call_id or ""),
        source_index=index,
        attachments=attachments,
    )


def _attachments(content: Any, rules: MediaRules) -> tuple[Attachment, ...]:
    """The images and files of checked content parts (``image_url`` and ``file``)."""
    if not isinstance(content, list):
        return ()
    out = []
    for part in content:
        kind = part["type"]
        if kind == "image_url":
            spec = part.get("image_url")
            url = spec.get("url") if isinstance(spec, dict) else spec
            detail = spec.get("detail") if isinstance(spec, dict) else None
            out.append(
                media.url_image(rules, url if isinstance(url, str) else "", detail_of(detail))
            )
        elif kind == "file":
            spec = part.get("file")
            name = spec.get("filename") if isinstance(spec, dict) else None
            out.append(media.file(rules, name if isinstance(name, str) else "file"))
    return tuple(out)


def detail_of(value: Any) -> str:
    return value if value in ("low", "high", "auto") else "auto"


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidSnapshot(where, "must be a string, null or a list of content parts")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidSnapshot(f"{where}[{k}]", "a content part needs a string 'type'")
        if part["type"] not in _PART_TYPES:
            raise InvalidSnapshot(
                f"{where}[{k}].type",
                f"unexpected content part type {part['type']!r} (is this an anthropic snapshot?)",
            )
        text = part.get("text", part.get("refusal"))
        if part["type"] in ("text", "refusal"):
            if not isinstance(text, str):
                raise InvalidSnapshot(f"{where}[{k}].text", "must be a string")
            texts.append(text)
    return "\n".join(texts)


def _tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidSnapshot(f"{where}.tool_calls", "must be a list")
    calls = []
    for k, call in enumerate(raw):
        at = f"{where}.tool_calls[{k}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise InvalidSnapshot(f"{at}.function", "a tool call needs a function object")
        cid = string_field(call, "id", at, nonempty=True)
        name = string_field(fn, "name", f"{at}.function", nonempty=True)
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            raise InvalidSnapshot(f"{at}.function.arguments", "must be a JSON string")
        calls.append(ToolCall(id=cid, name=name, arguments=args))
    return tuple(calls)


def render(
    messages: list[Message], *, with_ids: bool, source: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Wire messages for carried messages. One that is exactly what its source message
    (``source[m.source_index]``) normalizes to is that message, copied (images and all); a
    changed one (a stripped call or result, a shortened user turn) is written anew, keeping the
    source's image, file and audio parts after its text."""
    out = []
    for m in messages:
        src = source_of(m, source)
        if src is not None and normalizes_to(m, src, _message):
            copied = dict(src)
            if with_ids and "id" not in copied:
                copied = {"id": m.id, **copied}
            out.append(copied)
            continue
        raw: dict[str, Any] = {"id": m.id} if with_ids else {}
        raw["role"] = m.role
        raw["content"] = m.content if (m.content or not m.tool_calls) else None
        kept = _media_parts(src)
        if kept and m.role != "tool":
            raw["content"] = [{"type": "text", "text": m.content}, *kept]
        if m.tool_calls:
            raw["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in m.tool_calls
            ]
        if m.role == "tool":
            raw["tool_call_id"] = m.tool_call_id
        out.append(raw)
    return out


def _media_parts(src: dict[str, Any] | None) -> list[Any]:
    content = src.get("content") if src is not None else None
    if not isinstance(content, list):
        return []
    return [p for p in content if isinstance(p, dict) and p.get("type") not in _TEXT_PART_TYPES]


def text_message(role: str, text: str, *, msg_id: str | None) -> dict[str, Any]:
    raw: dict[str, Any] = {"id": msg_id} if msg_id else {}
    raw.update(role=role, content=text)
    return raw


def replace_tool_results(
    raw_messages: list[dict[str, Any]], bodies: dict[str, str]
) -> list[dict[str, Any]]:
    out = []
    for raw in raw_messages:
        cid = raw.get("tool_call_id") if raw.get("role") == "tool" else None
        out.append({**raw, "content": bodies[cid]} if cid in bodies else raw)
    return out
