"""OpenAI Responses API input items (the OpenAI Agents SDK's history).

Each wire item is one entry of ``messages`` and becomes one internal message:

- ``message`` (or an item with a ``role`` and no ``type``: an easy input message): its role
  (``developer`` counts as ``system``), the text of its ``input_text``/``output_text``/``refusal``
  parts (images and files are counted as attachments, :mod:`worker.wire.media`; audio is not; all
  pass through);
- ``reasoning``: an assistant message whose reasoning is the summary text (``encrypted_content``
  is opaque, not counted), marked ``joins_next`` so it is never separated from the call or
  message it produced;
- ``function_call`` / ``custom_tool_call`` and every other ``*_call`` item with a ``call_id``
  (``computer_call``, ``local_shell_call``, ``shell_call``, ...): an assistant message with one
  tool call (the call id is ``call_id``; the arguments are ``arguments``, a custom tool's
  ``input``, or the canonical JSON of the rest of the item);
- ``*_call_output`` with a ``call_id`` (a ``local_shell_call_output`` may name the call by its
  ``id``): the tool result; its text is a string ``output``, the text parts of a list, or the
  canonical JSON of any other output (a computer screenshot is an image: an attachment);
- any other item (``web_search_call``, ``file_search_call``, ``mcp_*``, ``item_reference``,
  ``image_generation_call``, ``code_interpreter_call``, types not invented yet): kept verbatim,
  counted as an assistant message whose content is the item's canonical JSON.

Replacements are Responses input items. The API checks item ids' prefixes (``msg_``, ``fc_``)
and looks stored ones up, so the summary has no ``id`` and a carried message or function/custom
call (or output) is copied without its own; other items keep theirs (required, or naming the
call). Replacement items thus get derived ids.
"""

from __future__ import annotations

from typing import Any

from worker.errors import InvalidSnapshot
from worker.wire import media
from worker.wire.formats.common import normalizes_to, source_of, string_field
from worker.wire.media import Attachment, MediaRules
from worker.wire.models import Message, ToolCall, canonical_json, is_plain_json

# The Responses API takes input items opening with any role.
OPENS_WITH_USER = False

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# Content parts: the ones whose text is read and counted, and the ones passed through unread.
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_OPAQUE_PARTS = {"input_image", "input_file", "input_audio"}
# Calls whose arguments are a string field of their own; other ``*_call`` items are JSON.
_ARGUMENT_FIELDS = {"function_call": "arguments", "custom_tool_call": "input"}
_NOT_ARGUMENTS = {"type", "id", "call_id", "status", "name"}
_TOOL_NAMES = {"computer_call": "computer"}  # else the item's name, else the type minus _call
_OUTPUT = "_output"
_ID_DROPPED = {
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
}
# Outputs that pair with their call whatever they carry (a missing call id is an error).
_KNOWN_OUTPUTS = {
    "function_call_output",
    "custom_tool_call_output",
    "computer_call_output",
    "local_shell_call_output",
}


def system_messages(system: Any) -> list[Message]:
    if system is not None:
        raise InvalidSnapshot(
            "system", "only the anthropic format has a top-level system (put it in messages)"
        )
    return []


def reusable(raw: dict[str, Any]) -> bool:
    """Whether an equal (``==``) item always normalizes to the same message: not when canonical
    JSON is read (1, 1.0 and true are ``==`` but differ there), unless it holds no number or
    boolean."""
    reading = _reading(raw)
    if reading in ("message", "reasoning") or (
        reading == "call" and raw["type"] in _ARGUMENT_FIELDS
    ):
        return True  # only strings are read
    if reading == "output":
        output = raw.get("output")
        return isinstance(output, str | list) or is_plain_json(output)
    return is_plain_json(raw)  # a call's arguments or an unknown item: canonical JSON


def _reading(raw: dict[str, Any]) -> str | None:
    """What an item is read as: ``message``, ``reasoning``, ``call``, ``output`` or ``other``
    (kept verbatim); None without a usable type."""
    kind = raw.get("type")
    if kind is None and "role" in raw:
        return "message"
    if not isinstance(kind, str) or not kind:
        return None
    if kind in ("message", "reasoning"):
        return kind
    paired = kind in _ARGUMENT_FIELDS or kind in _KNOWN_OUTPUTS or raw.get("call_id") is not None
    if paired and kind.endswith("_call"):
        return "call"
    if paired and kind.endswith("_call" + _OUTPUT):
        return "output"
    return "other"


def wire_message(
    index: int,
    raw: dict[str, Any],
    mid: str,
    names: dict[str, str],
    rules: MediaRules | None = None,
) -> list[Message]:
    """The internal message of one item; ``names`` maps earlier call ids to tools."""
    return [_item(index, raw, mid, names, rules or MediaRules())]


def _item(
    index: int, raw: dict[str, Any], mid: str, names: dict[str, str], rules: MediaRules
) -> Message:
    reading = _reading(raw)
    if reading is None:
        raise InvalidSnapshot(
            f"messages[{index}].type", "an item needs a string 'type' (or a 'role')"
        )
    if reading == "message":
        return _message(index, raw, mid, rules)
    if reading == "reasoning":
        return _reasoning(index, raw, mid)
    if reading == "call":
        return _call(index, raw["type"], raw, mid)
    if reading == "output":
        return _output(index, raw["type"], raw, mid, names, rules)
    return Message(id=mid, role="assistant", content=canonical_json(raw), source_index=index)


def _message(index: int, raw: dict[str, Any], mid: str, rules: MediaRules) -> Message:
    where = f"messages[{index}]"
    role = raw.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidSnapshot(f"{where}.role", f"unknown role {role!r}")
    content = raw.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = _parts_text(content, f"{where}.content")
    else:
        raise InvalidSnapshot(f"{where}.content", "must be a string or a list of content parts")
    return Message(
        id=mid,
        role=_ROLES[role],
        content=text,
        source_index=index,
        attachments=_attachments(content, rules),
    )


def _attachments(parts: Any, rules: MediaRules) -> tuple[Attachment, ...]:
    """The images and files of checked content parts (``input_image``, ``input_file``, a
    ``computer_screenshot``)."""
    if isinstance(parts, dict):
        parts = [parts]
    if not isinstance(parts, list):
        return ()
    out = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "computer_screenshot"):
            url = part.get("image_url")
            detail = part.get("detail")
            detail = detail if detail in ("low", "high", "auto") else "auto"
            out.append(media.url_image(rules, url if isinstance(url, str) else "", detail))
        elif kind == "input_file":
            name = part.get("filename")
            out.append(media.file(rules, name if isinstance(name, str) else "file"))
    return tuple(out)


def _parts_text(parts: list[Any], where: str) -> str:
    """The text of content parts: text and refusals are read, images, files and audio are
    passed through (images and files are counted by :func:`_attachments`)."""
    texts = []
    for k, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise InvalidSnapshot(f"{where}[{k}]", "a content part needs a string 'type'")
        field = _TEXT_PARTS.get(kind)
        if field is not None:
            texts.append(string_field(part, field, f"{where}[{k}]"))
        elif kind not in _OPAQUE_PARTS:
            raise InvalidSnapshot(f"{where}[{k}].type", f"unexpected content part type {kind!r}")
    return "\n".join(texts)


def _reasoning(index: int, raw: dict[str, Any], mid: str) -> Message:
    where = f"messages[{index}].summary"
    summary = raw.get("summary", [])
    if not isinstance(summary, list):
        raise InvalidSnapshot(where, "must be a list of summary_text parts")
    texts = []
    for k, part in enumerate(summary):
        if not isinstance(part, dict) or part.get("type") != "summary_text":
            raise InvalidSnapshot(f"{where}[{k}].type", "must be 'summary_text'")
        texts.append(string_field(part, "text", f"{where}[{k}]"))
    encrypted = raw.get("encrypted_content")
    if encrypted is not None and not isinstance(encrypted, str):
        raise InvalidSnapshot(f"messages[{index}].encrypted_content", "must be a string")
    return Message(
        id=mid,
        role="assistant",
        reasoning="\n".join(texts),
        source_index=index,
        joins_next=True,
    )


def _call(index: int, kind: str, raw: dict[str, Any], mid: str) -> Message:
    where = f"messages[{index}]"
    call_id = string_field(raw, "call_id", where, nonempty=True)
    field = _ARGUMENT_FIELDS.get(kind)
    if kind in _ARGUMENT_FIELDS:
        name = string_field(raw, "name", where, nonempty=True)
    else:
        given = raw.get("name")
        name = given if isinstance(given, str) and given else _tool_name(kind)
    if field is not None:
        arguments = string_field(raw, field, where)
    else:
        arguments = canonical_json({k: v for k, v in raw.items() if k not in _NOT_ARGUMENTS})
    return Message(
        id=mid,
        role="assistant",
        tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments),),
        source_index=index,
    )


def _tool_name(call_kind: str) -> str:
    return _TOOL_NAMES.get(call_kind, call_kind.removesuffix("_call"))


def _output(
    index: int,
    kind: str,
    raw: dict[str, Any],
    mid: str,
    names: dict[str, str],
    rules: MediaRules,
) -> Message:
    where = f"messages[{index}]"
    call_id = _output_call_id(raw, where)
    output = raw.get("output")
    if isinstance(output, str):
        text = output
    elif isinstance(output, list):
        text = _parts_text(output, f"{where}.output")
    elif kind == "computer_call_output" and isinstance(output, dict):
        text = ""  # a screenshot: an image, not read
    elif output is None and kind in ("function_call_output", "custom_tool_call_output"):
        raise InvalidSnapshot(f"{where}.output", "must be a string or a list of content parts")
    else:
        text = canonical_json(output)
    return Message(
        id=mid,
        role="tool",
        content=text,
        tool_call_id=call_id,
        tool_name=names.get(call_id),
        source_index=index,
        attachments=_attachments(output, rules),
    )


def _output_call_id(raw: dict[str, Any], where: str) -> str:
    """The call an output answers: ``call_id``; a ``local_shell_call_output`` without one names
    it by its ``id``."""
    if raw.get("call_id") is None and raw.get("type") == "local_shell_call_output":
        return string_field(raw, "id", where, nonempty=True)
    return string_field(raw, "call_id", where, nonempty=True)


# --- back to the wire ----------------------------------------------------------------------------


def render(
    messages: list[Message], *, with_ids: bool, source: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Replacement items for carried messages. A message that is exactly what its source item
    (``source[m.source_index]``) normalizes to is that item, copied (see :func:`_copy`); a changed
    one (stripped, shortened) is written anew: a user message as ``input_text``, a custom tool's
    call and output as custom items, every other call and output as a ``function_call`` /
    ``function_call_output`` pair (a marker fits neither a computer action nor a screenshot,
    so both halves of such an exchange are rewritten together). ``with_ids`` is ignored: the
    Responses API's item ids are its own."""
    del with_ids
    items = [_source_item(m, source) for m in messages]
    rewritten = {
        cid
        for m, (src, same) in zip(messages, items, strict=True)
        if not same
        for cid in _call_ids(m)
    }
    out = []
    for m, (src, same) in zip(messages, items, strict=True):
        if same and src is not None and not (rewritten & _call_ids(m)):
            out.append(_copy(src))
        else:
            out.append(_written(m, src))
    return out


def _source_item(
    m: Message, source: list[dict[str, Any]] | None
) -> tuple[dict[str, Any] | None, bool]:
    """The message's source item, and whether the message is exactly its normalization."""
    src = source_of(m, source)
    return src, src is not None and normalizes_to(m, src, _item)


def _copy(src: dict[str, Any]) -> dict[str, Any]:
    """A carried item as it was, without the ``id`` where the API takes none or checks it
    against stored items (a message, a function or custom tool call and their outputs); the id
    of any other item is required or names its call (``local_shell_call_output``): kept."""
    kind = src.get("type", "message")
    return {k: v for k, v in src.items() if k != "id" or kind not in _ID_DROPPED}


def _call_ids(m: Message) -> set[str]:
    ids = {c.id for c in m.tool_calls}
    if m.tool_call_id:
        ids.add(m.tool_call_id)
    return ids


def _written(m: Message, src: dict[str, Any] | None) -> dict[str, Any]:
    custom = src is not None and src.get("type") in ("custom_tool_call", "custom_tool_call_output")
    if m.role == "tool":
        kind = "custom_tool_call_output" if custom else "function_call_output"
        return {"type": kind, "call_id": m.tool_call_id, "output": m.content}
    if m.tool_calls:
        (call,) = m.tool_calls  # one call per item
        if custom:
            return {"type": "custom_tool_call", "call_id": call.id, "name": call.name,
                    "input": call.arguments}  # fmt: skip
        return {"type": "function_call", "call_id": call.id, "name": call.name,
                "arguments": call.arguments}  # fmt: skip
    written = text_message(m.role, m.content, msg_id=None)
    parts = src.get("content") if src is not None else None
    if isinstance(parts, list):  # a shortened turn keeps its images and files
        written["content"] += [
            p for p in parts if isinstance(p, dict) and p.get("type") in _OPAQUE_PARTS
        ]
    return written


def text_message(role: str, text: str, *, msg_id: str | None) -> dict[str, Any]:
    """A ``message`` item; without ``id`` (``msg_id`` is ignored: see the module)."""
    del msg_id
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def replace_tool_results(
    raw_messages: list[dict[str, Any]], bodies: dict[str, str]
) -> list[dict[str, Any]]:
    """Copies with the ``output`` of the given calls' outputs replaced, where the output is text
    (a string or a list of parts); an object output (a screenshot) is left as it is."""
    out = []
    for raw in raw_messages:
        kind = raw.get("type")
        if isinstance(kind, str) and kind.endswith("_call" + _OUTPUT):
            cid = raw.get("call_id")
            if cid is None and kind == "local_shell_call_output":
                cid = raw.get("id")
            if cid in bodies and isinstance(raw.get("output"), str | list):
                out.append({**raw, "output": bodies[cid]})
                continue
        out.append(raw)
    return out
