"""OpenAI Chat Completions messages.

Every role, content part and tool-call type of the ``openai`` SDK's ``ChatCompletionMessageParam``
is read (:data:`ROLES`, :data:`PART_TYPES`, :data:`TOOL_CALL_TYPES`). What is readable (text,
refusals, reasoning, a call's name and arguments or a custom tool's input) becomes the internal
message; what is opaque (an image's URL, a file's data and id, audio, an audio response's id) is
never read and passes through. A part or tool call of a type this module does not know is
carried as it came, never read, and counted by an estimate (``unknown_types``).

The deprecated ``function_call`` of an assistant message is a tool call whose id is made from
the message's id (:func:`function_call_id`); the ``function`` message after it answers it: the
newest earlier ``function_call`` of its ``name``.
"""

from __future__ import annotations

from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire import media
from worker.wire.formats.common import (
    FOREIGN_PARTS,
    MESSAGE_ROLES,
    foreign_part,
    no_system_field,
    normalizes_to,
    source_of,
    string_field,
    unknown_payload,
)
from worker.wire.media import Attachment, MediaRules
from worker.wire.models import Message, Role, ToolCall, derived_message_id, is_plain_json

# Chat Completions takes a history opening with any role after the system messages.
OPENS_WITH_USER = False

# What this format knows, as the SDK names it (tests check them against the installed SDK).
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
PART_TYPES = frozenset({"text", "refusal", "image_url", "input_audio", "file"})
TOOL_CALL_TYPES = frozenset({"function", "custom"})

_INTERNAL_ROLES: dict[str, Role] = {**MESSAGE_ROLES, "tool": "tool", "function": "tool"}
# The part types whose text is read (by the field that holds it); images and files are counted
# as attachments (worker.wire.media), audio passes through uncounted.
_TEXT_FIELDS = {"text": "text", "refusal": "refusal"}
# Fields a rewritten message is built from; it keeps every other field of its source as it was.
_REBUILT = frozenset(
    {
        "id",
        "role",
        "content",
        "refusal",
        "reasoning_content",
        "reasoning",
        "tool_calls",
        "function_call",
        "tool_call_id",
    }
)
_FUNCTION_CALL = "#function_call"


def function_call_id(message_id: str) -> str:
    """The tool-call id of the deprecated ``function_call`` of the message ``message_id``."""
    return message_id + _FUNCTION_CALL


system_messages = no_system_field


def reusable(raw: dict[str, Any]) -> bool:
    """Whether an equal (``==``) wire message always normalizes to the same message. Strings
    are read, and strings only equal strings; but an unknown part or call is counted by its
    JSON's size (1, 1.0 and true differ there), and a ``function`` message pairs by the calls
    before it, which may differ."""
    if raw.get("role") == "function":
        return False
    return not _has_unknown(raw) or is_plain_json(raw)


def _has_unknown(raw: dict[str, Any]) -> bool:
    content = raw.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") not in PART_TYPES:
                return True
    calls = raw.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict) and call.get("type", "function") not in TOOL_CALL_TYPES:
                return True
    return False


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
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidSnapshot(f"{where}.role", f"unknown role {role!r}")
    text, attachments, unknown = _content(raw.get("content"), f"{where}.content", rules)
    refusal = raw.get("refusal")
    if refusal is not None:
        if not isinstance(refusal, str):
            raise InvalidSnapshot(f"{where}.refusal", "must be a string or null")
        text = "\n".join(t for t in (text, refusal) if t)
    reasoning = raw.get("reasoning_content") or raw.get("reasoning") or ""
    if not isinstance(reasoning, str):
        raise InvalidSnapshot(f"{where}.reasoning_content", "must be a string")
    calls: tuple[ToolCall, ...] = ()
    if role == "assistant":
        calls, call_payloads, call_unknown = _tool_calls(raw.get("tool_calls"), where)
        calls += _function_call(raw.get("function_call"), where, mid)
        attachments += call_payloads
        unknown += call_unknown
    else:
        for field in ("tool_calls", "function_call"):
            if raw.get(field):
                raise InvalidSnapshot(f"{where}.{field}", f"a {role} message cannot call tools")
    call_id = _answered_call(role, raw, where, names)
    return Message(
        id=mid,
        role=_INTERNAL_ROLES[role],
        content=text,
        reasoning=reasoning,
        tool_calls=calls,
        tool_call_id=call_id,
        tool_name=names.get(call_id or ""),
        source_index=index,
        attachments=attachments,
        unknown_types=unknown,
    )


def _answered_call(role: str, raw: dict[str, Any], where: str, names: dict[str, str]) -> str | None:
    """The call a ``tool`` message (by ``tool_call_id``) or a ``function`` message (the newest
    earlier ``function_call`` of its ``name``) answers; None for other roles."""
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidSnapshot(f"{where}.tool_call_id", "a tool message needs a tool_call_id")
        return call_id
    if role != "function":
        return None
    name = string_field(raw, "name", where, nonempty=True)
    for call_id in reversed(names):
        if call_id.endswith(_FUNCTION_CALL) and names[call_id] == name:
            return call_id
    raise InvalidSnapshot(
        f"{where}.name", f"a function message answers no earlier function_call named {name!r}"
    )


def _content(
    content: Any, where: str, rules: MediaRules
) -> tuple[str, tuple[Attachment, ...], tuple[str, ...]]:
    """The text of a message's content, its images and files and the payloads of parts of
    unknown types (attachments), and those types."""
    if content is None:
        return "", (), ()
    if isinstance(content, str):
        return content, (), ()
    if not isinstance(content, list):
        raise InvalidSnapshot(where, "must be a string, null or a list of content parts")
    texts: list[str] = []
    attachments: list[Attachment] = []
    unknown: list[str] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidSnapshot(f"{where}[{k}]", "a content part needs a string 'type'")
        kind: str = part["type"]
        field = _TEXT_FIELDS.get(kind)
        if field is not None:
            texts.append(string_field(part, field, f"{where}[{k}]"))
        elif kind == "image_url":
            attachments.append(_image(part, rules))
        elif kind == "file":
            spec = part.get("file")
            name = spec.get("filename") if isinstance(spec, dict) else None
            attachments.append(media.file(rules, name if isinstance(name, str) else "file"))
        elif kind in FOREIGN_PARTS:
            raise foreign_part(kind, f"{where}[{k}]")
        elif kind not in PART_TYPES:
            attachments.append(unknown_payload(kind, part))
            unknown.append(kind)
    return "\n".join(texts), tuple(attachments), tuple(unknown)


def _image(part: dict[str, Any], rules: MediaRules) -> Attachment:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    detail = spec.get("detail") if isinstance(spec, dict) else None
    return media.url_image(rules, url if isinstance(url, str) else "", detail_of(detail))


def detail_of(value: Any) -> str:
    return value if value in ("low", "high", "auto") else "auto"


def _tool_calls(
    raw: Any, where: str
) -> tuple[tuple[ToolCall, ...], tuple[Attachment, ...], tuple[str, ...]]:
    """An assistant's tool calls, and the payloads and types of the calls of unknown types. A
    call of an unknown type with an ``id`` is still a call (named by its type, its arguments
    unread), so that the tool message answering it pairs with it."""
    if raw is None:
        return (), (), ()
    if not isinstance(raw, list):
        raise InvalidSnapshot(f"{where}.tool_calls", "must be a list")
    calls: list[ToolCall] = []
    payloads: list[Attachment] = []
    unknown: list[str] = []
    for k, call in enumerate(raw):
        at = f"{where}.tool_calls[{k}]"
        if not isinstance(call, dict):
            raise InvalidSnapshot(at, "must be an object")
        kind = call.get("type", "function")  # older clients sent no type: a function call
        if not isinstance(kind, str):
            raise InvalidSnapshot(f"{at}.type", "must be a string")
        if kind == "function":
            calls.append(_function_tool_call(call, at))
        elif kind == "custom":
            calls.append(_custom_tool_call(call, at))
        else:
            payloads.append(unknown_payload(kind, call))
            unknown.append(kind)
            cid = call.get("id")
            if isinstance(cid, str) and cid:
                calls.append(ToolCall(id=cid, name=kind))
    return tuple(calls), tuple(payloads), tuple(unknown)


def _function_tool_call(call: dict[str, Any], at: str) -> ToolCall:
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise InvalidSnapshot(f"{at}.function", "a tool call needs a function object")
    cid = string_field(call, "id", at, nonempty=True)
    name = string_field(fn, "name", f"{at}.function", nonempty=True)
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        raise InvalidSnapshot(f"{at}.function.arguments", "must be a JSON string")
    return ToolCall(id=cid, name=name, arguments=args)


def _custom_tool_call(call: dict[str, Any], at: str) -> ToolCall:
    spec = call.get("custom")
    if not isinstance(spec, dict):
        raise InvalidSnapshot(f"{at}.custom", "a custom tool call needs a custom object")
    cid = string_field(call, "id", at, nonempty=True)
    name = string_field(spec, "name", f"{at}.custom", nonempty=True)
    return ToolCall(id=cid, name=name, arguments=string_field(spec, "input", f"{at}.custom"))


def _function_call(raw: Any, where: str, mid: str) -> tuple[ToolCall, ...]:
    """The deprecated ``function_call`` of an assistant message, as a tool call."""
    if raw is None:
        return ()
    at = f"{where}.function_call"
    if not isinstance(raw, dict):
        raise InvalidSnapshot(at, "must be an object with a name and arguments")
    name = string_field(raw, "name", at, nonempty=True)
    args = raw.get("arguments", "")
    if not isinstance(args, str):
        raise InvalidSnapshot(f"{at}.arguments", "must be a JSON string")
    return (ToolCall(id=function_call_id(mid), name=name, arguments=args),)


# --- back to the wire ----------------------------------------------------------------------------


def render(
    messages: list[Message], *, with_ids: bool, source: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Wire messages for carried messages. One that is exactly what its source message
    (``source[m.source_index]``) normalizes to is that message, copied (images and all); a
    changed one (a stripped call or result, a shortened user turn) is written anew (see
    :func:`_written`)."""
    out = []
    for m in messages:
        src = source_of(m, source)
        if src is not None and normalizes_to(m, src, _message):
            copied = dict(src)
            if with_ids and "id" not in copied:
                copied = {"id": m.id, **copied}
            out.append(copied)
        else:
            out.append(_written(m, src, with_ids=with_ids))
    return out


def _written(m: Message, src: dict[str, Any] | None, *, with_ids: bool) -> dict[str, Any]:
    """A changed message written anew. It keeps, as they were, every field of its source it is
    not built from (an audio response's id, a participant's name), the source's parts other
    than text (images, files, audio, parts of unknown types; not in a tool result, whose body
    is what changed), and its calls of unknown types without an id; a custom tool call is
    written as a custom call, the deprecated ``function_call`` as one."""
    raw: dict[str, Any] = {"id": m.id} if with_ids else {}
    if src is not None:
        raw.update((k, v) for k, v in src.items() if k not in _REBUILT)
    raw["role"] = _wire_role(m, src)
    kept = _kept_parts(src) if m.role != "tool" else []
    if kept:
        raw["content"] = ([{"type": "text", "text": m.content}] if m.content else []) + kept
    else:
        raw["content"] = m.content if (m.content or not m.tool_calls) else None
    if m.reasoning:
        raw["reasoning_content"] = m.reasoning
    calls = _written_calls(m, src)
    if calls:
        raw["tool_calls"] = calls
    function_call = [c for c in m.tool_calls if c.id == function_call_id(m.id)]
    if function_call:
        raw["function_call"] = {
            "name": function_call[0].name,
            "arguments": function_call[0].arguments,
        }
    if raw["role"] == "tool":
        raw["tool_call_id"] = m.tool_call_id
    elif raw["role"] == "function" and "name" not in raw:
        raw["name"] = m.tool_name
    return raw


def _wire_role(m: Message, src: dict[str, Any] | None) -> str:
    """The source's own role when it means the same (``developer``, ``function``), else the
    internal one."""
    if src is not None:
        role = src.get("role")
        if isinstance(role, str) and _INTERNAL_ROLES.get(role) == m.role:
            return role
    if m.role == "tool" and (m.tool_call_id or "").endswith(_FUNCTION_CALL):
        return "function"
    return m.role


def _written_calls(m: Message, src: dict[str, Any] | None) -> list[Any]:
    original: dict[str, dict[str, Any]] = {}
    unread: list[Any] = []  # calls of unknown types without an id: never rebuilt, always kept
    wire_calls = src.get("tool_calls") if src is not None else None
    for call in wire_calls if isinstance(wire_calls, list) else []:
        cid = call.get("id") if isinstance(call, dict) else None
        if isinstance(cid, str) and cid:
            original[cid] = call
        elif isinstance(call, dict) and call.get("type", "function") not in TOOL_CALL_TYPES:
            unread.append(call)
    out: list[Any] = []
    for c in m.tool_calls:
        if c.id == function_call_id(m.id):
            continue
        given = original.get(c.id)
        kind = given.get("type", "function") if given is not None else "function"
        if kind == "custom":
            out.append(
                {"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments}}
            )
        elif kind == "function" or given is None:
            out.append(
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
            )
        else:
            out.append(given)  # an unknown type is never rebuilt: its arguments were not read
    return out + unread


def _kept_parts(src: dict[str, Any] | None) -> list[Any]:
    content = src.get("content") if src is not None else None
    if not isinstance(content, list):
        return []
    return [p for p in content if isinstance(p, dict) and p.get("type") not in _TEXT_FIELDS]


def text_message(role: str, text: str, *, msg_id: str | None) -> dict[str, Any]:
    raw: dict[str, Any] = {"id": msg_id} if msg_id else {}
    raw.update(role=role, content=text)
    return raw


def replace_tool_results(
    raw_messages: list[dict[str, Any]], bodies: dict[str, str]
) -> list[dict[str, Any]]:
    """Copies with the bodies of the given calls' results replaced: a ``tool`` message's by its
    ``tool_call_id``, a ``function`` message's by the id of the ``function_call`` it answers."""
    functions = _function_results(raw_messages) if _names_a_function_call(bodies) else {}
    out = []
    for index, raw in enumerate(raw_messages):
        role = raw.get("role")
        cid = raw.get("tool_call_id") if role == "tool" else functions.get(index)
        out.append({**raw, "content": bodies[cid]} if cid in bodies else raw)
    return out


def _names_a_function_call(bodies: dict[str, str]) -> bool:
    return any(cid.endswith(_FUNCTION_CALL) for cid in bodies)


def _function_results(raw_messages: list[dict[str, Any]]) -> dict[int, str]:
    """The call id each ``function`` message answers, by index, paired as :func:`_message`
    pairs them (message ids as :func:`worker.wire.formats.source_ids` gives them)."""
    newest: dict[str, str] = {}
    out: dict[int, str] = {}
    for index, raw in enumerate(raw_messages):
        call = raw.get("function_call") if raw.get("role") == "assistant" else None
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            own = raw.get("id")
            mid = own if isinstance(own, str) else derived_message_id(index, raw)
            newest[call["name"]] = function_call_id(mid)
        elif raw.get("role") == "function" and raw.get("name") in newest:
            out[index] = newest[raw["name"]]
    return out
