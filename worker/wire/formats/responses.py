"""OpenAI Responses API input items (the OpenAI Agents SDK's history).

Each wire item is one entry of ``messages`` and becomes one internal message. Every item type of
the ``openai`` SDK's ``ResponseInputItemParam`` is known (:data:`ITEM_TYPES`), read as one of:

- a **message** (``message``, or an item with a ``role`` and no ``type``): its role (``developer``
  counts as ``system``), the text of its ``input_text``/``output_text``/``refusal`` parts (images
  and files are counted as attachments, :mod:`worker.wire.media`; audio is not; all pass
  through);
- **reasoning**: an assistant message whose reasoning is the summary (and reasoning) text
  (``encrypted_content`` is opaque, not counted), marked ``joins_next`` so it is never separated
  from the call or message it produced;
- a **compaction** (the provider's own compaction of everything before it): no readable text,
  its encrypted content counted by the conservative estimate, ``native_compaction``; never
  rebuilt, always copied exactly;
- a **call** (:data:`_CALLS`): an assistant message with one tool call, answered by its
  **output** (:data:`_OUTPUTS`) with the same ``call_id`` (a ``local_shell_call_output`` may
  name the call by its ``id``; an ``mcp_approval_response`` names its ``mcp_approval_request``
  by ``approval_request_id``);
- any **other** item (web and file search, image generation, code interpreter, MCP tool lists
  and calls, item references, tool and configuration updates): an assistant message whose text
  is the item's readable JSON.

Text is read only from readable fields: an item's JSON is read as
:func:`worker.wire.formats.common.readable_json` gives it (no ids, no encrypted content, no data
URLs, no credentials an MCP tool list carries, no program's replay fingerprint), without an
image generation's base64 result (counted as an image). An item of a type this module does not
know is carried as it came, never read, counted by an estimate (``unknown_types``); one whose
type ends in ``_call`` and that has a new ``call_id`` is a call (of the tool its type names), and
one whose type ends in ``_call_output`` and names an earlier call answers it, so that a
compaction keeps the two together.

Replacements are Responses input items. The API checks item ids' prefixes (``msg_``, ``fc_``)
and looks stored ones up, so the summary has no ``id`` and a carried message or function/custom
call (or output) is copied without its own; every other item is copied exactly, id and all.
Replacement items thus get derived ids.
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
    readable_json,
    source_of,
    string_field,
    unknown_payload,
)
from worker.wire.media import Attachment, MediaRules
from worker.wire.models import Message, ToolCall, is_plain_json

# The Responses API takes input items opening with any role.
OPENS_WITH_USER = False

_ROLES = MESSAGE_ROLES
# Content parts: the ones whose text is read (by the field that holds it), and the ones passed
# through unread (images and files counted as attachments).
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_MEDIA_PARTS = frozenset({"input_image", "input_file", "input_audio"})
_READ_PARTS = frozenset({*_TEXT_PARTS, *_MEDIA_PARTS})
_SUMMARY_PARTS = frozenset({"summary_text"})
_REASONING_PARTS = frozenset({"reasoning_text"})

# Calls: the tool a call is of when it has no ``name`` of its own (""; it must have one), and
# the string field holding its arguments (None: the readable JSON of the rest of the item).
_CALLS: dict[str, tuple[str, str | None]] = {
    "function_call": ("", "arguments"),
    "custom_tool_call": ("", "input"),
    "mcp_approval_request": ("", "arguments"),
    "computer_call": ("computer", None),
    "local_shell_call": ("local_shell", None),
    "shell_call": ("shell", None),
    "apply_patch_call": ("apply_patch", None),
    "tool_search_call": ("tool_search", None),
    "program": ("program", "code"),
}
# Outputs, by what their text is read from: ``output`` (a string, text parts, or its readable
# JSON), ``shell`` (the commands' stdout and stderr), ``result`` (a string field), ``rest`` (the
# readable JSON of the item without its type, ids and status).
_OUTPUTS: dict[str, str] = {
    "function_call_output": "output",
    "custom_tool_call_output": "output",
    "computer_call_output": "output",
    "local_shell_call_output": "output",
    "apply_patch_call_output": "output",
    "shell_call_output": "shell",
    "program_output": "result",
    "tool_search_output": "rest",
    "mcp_approval_response": "rest",
}
# Where a call's id is, when not in ``call_id``; calls and outputs whose id the SDK makes
# optional are items on their own without one.
_CALL_ID_FIELDS = {"mcp_approval_request": "id", "mcp_approval_response": "approval_request_id"}
_OPTIONAL_CALL_IDS = frozenset({"tool_search_call", "tool_search_output"})
_OTHER = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_list_tools",
        "mcp_call",
        "item_reference",
        "additional_tools",
        "configuration_update",
        "compaction_trigger",
    }
)
ITEM_TYPES: frozenset[str] = frozenset(
    {"message", "reasoning", "compaction", *_CALLS, *_OUTPUTS, *_OTHER}
)
_COMPACTION = "compaction"

# Not part of a call's arguments when they are read from the item's JSON.
_NOT_ARGUMENTS = frozenset({"type", "id", "call_id", "status", "name", "caller"})
# Exchanges a compaction may write anew (a stripped call or output): as a custom tool's pair,
# or as a function_call / function_call_output pair. Every other item is copied as it was.
_REBUILDABLE = frozenset(
    {
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "computer_call",
        "computer_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
    }
)
_ID_DROPPED = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
    }
)


system_messages = no_system_field


def reusable(raw: dict[str, Any]) -> bool:
    """Whether an equal (``==``) item always normalizes to the same message: when only strings
    are read (strings only equal strings), or when the item holds no number or boolean (JSON is
    read, or counted by its size, where 1, 1.0 and true differ). Never an item of an unknown
    type: whether it pairs depends on the calls before it."""
    kind = _kind(raw)
    if kind not in ITEM_TYPES:
        return False
    if kind == "message":
        return _known_parts(raw.get("content"), _READ_PARTS) or is_plain_json(raw)
    if kind == "reasoning":
        return (
            _known_parts(raw.get("summary"), _SUMMARY_PARTS)
            and _known_parts(raw.get("content"), _REASONING_PARTS)
        ) or is_plain_json(raw)
    if kind == _COMPACTION or (kind in _CALLS and _CALLS[kind][1] is not None):
        return True
    if _OUTPUTS.get(kind) == "output":
        output = raw.get("output")
        return (
            isinstance(output, str)
            or (isinstance(output, list) and _known_parts(output, _READ_PARTS))
            or is_plain_json(raw)
        )
    return is_plain_json(raw)


def _known_parts(parts: Any, known: frozenset[str]) -> bool:
    """Whether every part of ``parts`` (a list, or anything else: no parts) is of a type in
    ``known``."""
    if not isinstance(parts, list):
        return True
    return all(isinstance(p, dict) and p.get("type") in known for p in parts)


def _kind(raw: dict[str, Any]) -> str | None:
    """The item's type: ``message`` for an easy input message (a ``role``, no ``type``),
    ``item_reference`` for an item with only an ``id`` (its type is optional); None without
    a usable one."""
    kind = raw.get("type")
    if kind is None:
        if "role" in raw:
            return "message"
        return "item_reference" if isinstance(raw.get("id"), str) else None
    return kind if isinstance(kind, str) and kind else None


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
    kind = _kind(raw)
    if kind is None:
        raise InvalidSnapshot(
            f"messages[{index}].type", "an item needs a string 'type' (or a 'role')"
        )
    if kind == "message":
        return _message(index, raw, mid, rules)
    if kind == "reasoning":
        return _reasoning(index, raw, mid)
    if kind == _COMPACTION:
        return _compaction(index, raw, mid)
    if kind in _CALLS and (kind not in _OPTIONAL_CALL_IDS or raw.get("call_id") is not None):
        return _call(index, kind, raw, mid)
    if kind in _OUTPUTS and (kind not in _OPTIONAL_CALL_IDS or raw.get("call_id") is not None):
        return _output(index, kind, raw, mid, names, rules)
    if kind in ITEM_TYPES:
        return _other(index, kind, raw, mid, rules)
    return _unknown(index, kind, raw, mid, names)


def _message(index: int, raw: dict[str, Any], mid: str, rules: MediaRules) -> Message:
    where = f"messages[{index}]"
    role = raw.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidSnapshot(f"{where}.role", f"unknown role {role!r}")
    content = raw.get("content")
    attachments: tuple[Attachment, ...] = ()
    unknown: tuple[str, ...] = ()
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text, attachments, unknown = _parts(content, f"{where}.content", rules)
    else:
        raise InvalidSnapshot(f"{where}.content", "must be a string or a list of content parts")
    return Message(
        id=mid,
        role=_ROLES[role],
        content=text,
        source_index=index,
        attachments=attachments,
        unknown_types=unknown,
    )


def _parts(
    parts: list[Any], where: str, rules: MediaRules
) -> tuple[str, tuple[Attachment, ...], tuple[str, ...]]:
    """The text of content parts (text and refusals), their images and files and the payloads
    of parts of unknown types (attachments), and those types."""
    texts: list[str] = []
    attachments: list[Attachment] = []
    unknown: list[str] = []
    for k, part in enumerate(parts):
        _read_part(part, f"{where}[{k}]", rules, texts, attachments, unknown)
    return "\n".join(texts), tuple(attachments), tuple(unknown)


def _read_part(
    part: Any,
    at: str,
    rules: MediaRules,
    texts: list[str],
    attachments: list[Attachment],
    unknown: list[str],
) -> None:
    """One content part, read into the lists given."""
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(kind, str):
        raise InvalidSnapshot(at, "a content part needs a string 'type'")
    field = _TEXT_PARTS.get(kind)
    if field is not None:
        texts.append(string_field(part, field, at))
    elif kind in _MEDIA_PARTS:
        attachments += _media(part, rules)
    elif kind in FOREIGN_PARTS:
        raise foreign_part(kind, at)
    else:
        attachments.append(unknown_payload(kind, part))
        unknown.append(kind)


def _media(part: dict[str, Any], rules: MediaRules) -> list[Attachment]:
    """The attachment of an ``input_image`` part (or a ``computer_screenshot``) or an
    ``input_file`` part; none for audio."""
    kind = part.get("type")
    if kind in ("input_image", "computer_screenshot"):
        url = part.get("image_url")
        detail = part.get("detail")
        detail = detail if detail in ("low", "high", "auto") else "auto"
        return [media.url_image(rules, url if isinstance(url, str) else "", detail)]
    if kind == "input_file":
        name = part.get("filename")
        return [media.file(rules, name if isinstance(name, str) else "file")]
    return []


def _reasoning(index: int, raw: dict[str, Any], mid: str) -> Message:
    where = f"messages[{index}]"
    summary = raw.get("summary", [])
    if not isinstance(summary, list):
        raise InvalidSnapshot(f"{where}.summary", "must be a list of summary_text parts")
    content = raw.get("content")
    if content is not None and not isinstance(content, list):
        raise InvalidSnapshot(f"{where}.content", "must be a list of reasoning_text parts")
    texts: list[str] = []
    attachments: list[Attachment] = []
    unknown: list[str] = []
    for key, known, parts in (
        ("summary", "summary_text", summary),
        ("content", "reasoning_text", content or []),
    ):
        for k, part in enumerate(parts):
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str):
                raise InvalidSnapshot(f"{where}.{key}[{k}].type", f"must be '{known}'")
            if kind == known:
                texts.append(string_field(part, "text", f"{where}.{key}[{k}]"))
            else:
                attachments.append(unknown_payload(kind, part))
                unknown.append(kind)
    encrypted = raw.get("encrypted_content")
    if encrypted is not None and not isinstance(encrypted, str):
        raise InvalidSnapshot(f"{where}.encrypted_content", "must be a string")
    return Message(
        id=mid,
        role="assistant",
        reasoning="\n".join(texts),
        source_index=index,
        joins_next=True,
        attachments=tuple(attachments),
        unknown_types=tuple(unknown),
    )


def _compaction(index: int, raw: dict[str, Any], mid: str) -> Message:
    """The provider's compaction of everything before it: nothing of it is readable, and its
    size is only known as the length of its encrypted content."""
    encrypted = string_field(raw, "encrypted_content", f"messages[{index}]")
    return Message(
        id=mid,
        role="assistant",
        source_index=index,
        attachments=(media.opaque("compaction (encrypted)", len(encrypted)),),
        native_compaction=True,
    )


def _call(index: int, kind: str, raw: dict[str, Any], mid: str) -> Message:
    where = f"messages[{index}]"
    call_id = string_field(raw, _CALL_ID_FIELDS.get(kind, "call_id"), where, nonempty=True)
    default_name, field = _CALLS[kind]
    if not default_name:
        name = string_field(raw, "name", where, nonempty=True)
    else:
        given = raw.get("name")
        name = given if isinstance(given, str) and given else default_name
    if field is not None:
        arguments = string_field(raw, field, where)
    else:
        arguments = readable_json({k: v for k, v in raw.items() if k not in _NOT_ARGUMENTS})
    return Message(
        id=mid,
        role="assistant",
        tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments),),
        source_index=index,
    )


def _output(
    index: int,
    kind: str,
    raw: dict[str, Any],
    mid: str,
    names: dict[str, str],
    rules: MediaRules,
) -> Message:
    where = f"messages[{index}]"
    call_id = _output_call_id(kind, raw, where)
    reading = _OUTPUTS[kind]
    attachments: tuple[Attachment, ...] = ()
    unknown: tuple[str, ...] = ()
    if reading == "result":
        text = string_field(raw, "result", where)
    elif reading == "rest":
        text = readable_json({k: v for k, v in raw.items() if k not in _NOT_ARGUMENTS})
    elif reading == "shell" and isinstance(raw.get("output"), list):
        text, attachments, unknown = _shell_output(raw["output"], f"{where}.output", rules)
    else:
        text, attachments, unknown = _output_text(kind, raw.get("output"), where, rules)
    return Message(
        id=mid,
        role="tool",
        content=text,
        tool_call_id=call_id,
        tool_name=names.get(call_id),
        source_index=index,
        attachments=attachments,
        unknown_types=unknown,
    )


def _output_call_id(kind: str, raw: dict[str, Any], where: str) -> str:
    """The call an output answers: ``call_id`` (an approval's ``approval_request_id``); a
    ``local_shell_call_output`` without one names it by its ``id``."""
    if kind == "local_shell_call_output" and raw.get("call_id") is None:
        return string_field(raw, "id", where, nonempty=True)
    return string_field(raw, _CALL_ID_FIELDS.get(kind, "call_id"), where, nonempty=True)


def _output_text(
    kind: str, output: Any, where: str, rules: MediaRules
) -> tuple[str, tuple[Attachment, ...], tuple[str, ...]]:
    """A string ``output``, the text of a list of parts, nothing of a screenshot (an image),
    else the output's readable JSON."""
    if isinstance(output, str):
        return output, (), ()
    if isinstance(output, list):
        return _parts(output, f"{where}.output", rules)
    if isinstance(output, dict) and output.get("type") == "computer_screenshot":
        return "", tuple(_media(output, rules)), ()
    if output is None and kind in ("function_call_output", "custom_tool_call_output"):
        raise InvalidSnapshot(f"{where}.output", "must be a string or a list of content parts")
    return ("" if output is None else readable_json(output)), (), ()


def _shell_output(
    entries: list[Any], where: str, rules: MediaRules
) -> tuple[str, tuple[Attachment, ...], tuple[str, ...]]:
    """A shell call's output: per command, its stdout, its stderr and how it ended (an entry
    with a ``type`` is read as a content part)."""
    texts: list[str] = []
    attachments: list[Attachment] = []
    unknown: list[str] = []
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidSnapshot(f"{where}[{k}]", "must be an object with stdout and stderr")
        if "type" in entry:
            _read_part(entry, f"{where}[{k}]", rules, texts, attachments, unknown)
            continue
        for stream in ("stdout", "stderr"):
            text = string_field(entry, stream, f"{where}[{k}]")
            if text:
                texts.append(text)
        texts.append(_outcome(entry.get("outcome")))
    return "\n".join(t for t in texts if t), tuple(attachments), tuple(unknown)


def _outcome(outcome: Any) -> str:
    if not isinstance(outcome, dict):
        return ""
    kind = outcome.get("type")
    if kind == "exit":
        return f"[exit code {readable_json(outcome.get('exit_code'))}]"
    return f"[{kind}]" if isinstance(kind, str) and kind else ""


def _other(index: int, kind: str, raw: dict[str, Any], mid: str, rules: MediaRules) -> Message:
    """An item that is neither a message nor part of an exchange: its readable JSON. An image
    generation's result is an image (base64), counted as one and never read."""
    attachments: tuple[Attachment, ...] = ()
    if kind == "image_generation_call":
        result = raw.get("result")
        if isinstance(result, str) and result:
            fmt = raw.get("output_format")
            mime = f"image/{fmt}" if isinstance(fmt, str) else "image"
            attachments = (media.image(rules, data=result, media_type=mime),)
        raw = {k: v for k, v in raw.items() if k != "result"}
    return Message(
        id=mid,
        role="assistant",
        content=readable_json({**raw, "type": kind}),
        source_index=index,
        attachments=attachments,
    )


def _unknown(
    index: int, kind: str, raw: dict[str, Any], mid: str, names: dict[str, str]
) -> Message:
    """An item of a type this module does not know: never read, counted by the estimate of its
    size. A ``*_call`` with a new ``call_id`` is a call of the tool its type names, a
    ``*_call_output`` naming an earlier call answers it (so the two stay together); neither
    can then be an error."""
    payload = (unknown_payload(kind, raw),)
    call_id = raw.get("call_id")
    if isinstance(call_id, str) and call_id:
        if kind.endswith("_call") and call_id not in names:
            call = ToolCall(id=call_id, name=kind.removesuffix("_call") or kind)
            return Message(
                id=mid,
                role="assistant",
                tool_calls=(call,),
                source_index=index,
                attachments=payload,
                unknown_types=(kind,),
            )
        if kind.endswith("_call_output") and call_id in names:
            return Message(
                id=mid,
                role="tool",
                tool_call_id=call_id,
                tool_name=names[call_id],
                source_index=index,
                attachments=payload,
                unknown_types=(kind,),
            )
    return Message(
        id=mid, role="assistant", source_index=index, attachments=payload, unknown_types=(kind,)
    )


# --- back to the wire ----------------------------------------------------------------------------


def render(
    messages: list[Message], *, with_ids: bool, source: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Replacement items for carried messages. A message that is exactly what its source item
    (``source[m.source_index]``) normalizes to is that item, copied (see :func:`_copy`); so is
    an item that cannot be rebuilt (a compaction, an approval, a program, an item of an unknown
    type: only :data:`_REBUILDABLE` exchanges and messages can), whatever the compaction did to
    its message, and so is every item of an exchange holding one. A changed one (stripped,
    shortened) is written anew: a user message as ``input_text``, a custom tool's call and
    output as custom items, every other call and output as a ``function_call`` /
    ``function_call_output`` pair (a marker fits neither a computer action nor a screenshot,
    so both halves of such an exchange are rewritten together). ``with_ids`` is ignored: the
    Responses API's item ids are its own."""
    del with_ids
    items = [_source_item(m, source) for m in messages]
    changed: set[str] = set()
    fixed: set[str] = set()
    for m, (src, same) in zip(messages, items, strict=True):
        if src is not None and not _rebuildable(src):
            fixed |= _call_ids(m)
        elif not same:
            changed |= _call_ids(m)
    out = []
    for m, (src, same) in zip(messages, items, strict=True):
        ids = _call_ids(m)
        if src is not None and _kept_as_it_was(src, same, ids, changed, fixed):
            out.append(_copy(src))
        else:
            out.append(_written(m, src))
    return out


def _kept_as_it_was(
    src: dict[str, Any], same: bool, ids: set[str], changed: set[str], fixed: set[str]
) -> bool:
    """Whether a carried item is copied: it cannot be rebuilt, or belongs to an exchange with
    an item that cannot; or it is unchanged, and so is the rest of its exchange."""
    if not _rebuildable(src) or ids & fixed:
        return True
    return same and not (ids & changed)


def _rebuildable(src: dict[str, Any]) -> bool:
    kind = _kind(src)
    return kind == "message" or kind in _REBUILDABLE


def _source_item(
    m: Message, source: list[dict[str, Any]] | None
) -> tuple[dict[str, Any] | None, bool]:
    """The message's source item, and whether the message is exactly its normalization."""
    src = source_of(m, source)
    return src, src is not None and normalizes_to(m, src, _item)


def _copy(src: dict[str, Any]) -> dict[str, Any]:
    """A carried item as it was, without the ``id`` where the API takes none or checks it
    against stored items (a message, a function or custom tool call and their outputs); every
    other item is copied exactly, id and all (required, or naming its call)."""
    if _kind(src) not in _ID_DROPPED or "id" not in src:
        return src
    return {k: v for k, v in src.items() if k != "id"}


def _call_ids(m: Message) -> set[str]:
    ids = {c.id for c in m.tool_calls}
    if m.tool_call_id:
        ids.add(m.tool_call_id)
    return ids


def _written(m: Message, src: dict[str, Any] | None) -> dict[str, Any]:
    kind = src.get("type") if src is not None else None
    custom = kind in ("custom_tool_call", "custom_tool_call_output")
    same_kind = kind in ("function_call", "function_call_output") or custom
    # A call rewritten as the kind it was keeps the namespace that names its tool.
    extra = {"namespace": src["namespace"]} if same_kind and src and "namespace" in src else {}
    if m.role == "tool":
        out_kind = "custom_tool_call_output" if custom else "function_call_output"
        return {"type": out_kind, "call_id": m.tool_call_id, "output": m.content}
    if m.tool_calls:
        (call,) = m.tool_calls  # one call per item
        if custom:
            return {"type": "custom_tool_call", "call_id": call.id, "name": call.name,
                    "input": call.arguments, **extra}  # fmt: skip
        return {"type": "function_call", "call_id": call.id, "name": call.name,
                "arguments": call.arguments, **extra}  # fmt: skip
    return _written_message(m, src)


def _written_message(m: Message, src: dict[str, Any] | None) -> dict[str, Any]:
    """A changed message item (a shortened user turn): its text as one part, then the source's
    parts other than text (images, files, audio, parts of unknown types) as they were; every
    other field of the source (``phase``, ``status``) kept, its ``id`` not."""
    written = text_message(m.role, m.content, msg_id=None)
    if src is None:
        return written
    kept = {k: v for k, v in src.items() if k not in ("id", "type", "role", "content")}
    parts = src.get("content")
    if isinstance(parts, list):
        written["content"] += [
            p for p in parts if isinstance(p, dict) and p.get("type") not in _TEXT_PARTS
        ]
    if isinstance(src.get("role"), str) and _ROLES.get(src["role"]) == m.role:
        written["role"] = src["role"]
    return {**written, **kept}


def text_message(role: str, text: str, *, msg_id: str | None) -> dict[str, Any]:
    """A ``message`` item; without ``id`` (``msg_id`` is ignored: see the module)."""
    del msg_id
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def replace_tool_results(
    raw_messages: list[dict[str, Any]], bodies: dict[str, str]
) -> list[dict[str, Any]]:
    """Copies with the ``output`` of the given calls' outputs replaced, where the output is text
    (a string or a list of parts; a shell call's output by one entry holding the text as its
    stdout, with the outcome of its last command); other outputs (a screenshot, an approval, a
    program's result) are left as they are."""
    out = []
    for raw in raw_messages:
        kind = raw.get("type")
        if isinstance(kind, str) and _OUTPUTS.get(kind) in ("output", "shell"):
            cid = raw.get("call_id")
            if cid is None and kind == "local_shell_call_output":
                cid = raw.get("id")
            output = raw.get("output")
            if cid in bodies and isinstance(output, str | list):
                out.append({**raw, "output": _replaced(kind, output, bodies[cid])})
                continue
        out.append(raw)
    return out


def _replaced(kind: str, output: str | list[Any], body: str) -> str | list[Any]:
    """The new ``output``: the body; for a shell call's list of entries, one entry holding it
    with the outcome of the last command (without one, no valid entry: left as it was)."""
    if kind != "shell_call_output" or not isinstance(output, list):
        return body
    last = output[-1] if output and isinstance(output[-1], dict) else {}
    if "outcome" not in last:
        return output
    return [{"stdout": body, "stderr": "", "outcome": last["outcome"]}]
