"""Wire formats: agents' messages <-> the internal :class:`~worker.models.Message` model.

One module per format. Each offers the same four functions, dispatched here:
``to_messages`` (validate and normalize), ``render`` (internal -> wire, for replacements),
``text_message`` and ``replace_tool_results`` (the projected request, edited in the agent's own
wire format so that everything we do not understand, such as images, passes through untouched).
"""

from __future__ import annotations

from typing import Any

from worker.errors import InvalidSnapshot
from worker.formats import anthropic, openai
from worker.models import Message, WireFormat, derived_message_id

_MODULES = {"openai": openai, "anthropic": anthropic}
MAX_ID_CHARS = 256


def source_ids(raw_messages: list[dict[str, Any]], *, known: list[str] | None = None) -> list[str]:
    """Each wire message's id: its own ``id`` when it has one, else a stable derived id.

    ``known`` are the ids of a prefix of ``raw_messages`` already computed (an earlier snapshot
    of the same conversation that starts with the same messages)."""
    ids: list[str] = list(known or ())
    seen: set[str] = set(ids)
    for index in range(len(ids), len(raw_messages)):
        raw = raw_messages[index]
        if not isinstance(raw, dict):
            raise InvalidSnapshot(f"messages[{index}]", "must be an object")
        own = raw.get("id")
        if own is not None and (not isinstance(own, str) or not own or len(own) > MAX_ID_CHARS):
            raise InvalidSnapshot(
                f"messages[{index}].id", f"must be a string of 1-{MAX_ID_CHARS} characters"
            )
        mid = own if own is not None else derived_message_id(index, raw)
        if mid in seen:
            raise InvalidSnapshot(f"messages[{index}].id", f"duplicate message id {mid!r}")
        seen.add(mid)
        ids.append(mid)
    return ids


def to_messages(
    fmt: WireFormat,
    raw_messages: list[dict[str, Any]],
    *,
    system: Any = None,
    ids: list[str] | None = None,
    known: list[Message] | None = None,
    known_count: int = 0,
) -> list[Message]:
    """Validate and normalize; ``ids`` are the wire messages' ids when already computed.

    ``known`` are the normalized messages of an earlier snapshot whose first ``known_count``
    wire messages (and system prompt) equal these: they are reused, not normalized again."""
    ids = source_ids(raw_messages) if ids is None else ids
    module = _MODULES[fmt]
    if known is not None and known_count:
        out = [m for m in known if m.source_index < known_count]
    else:
        out, known_count = module.system_messages(system), 0
    names = {c.id: c.name for m in out for c in m.tool_calls}
    for index in range(known_count, len(raw_messages)):
        for message in module.wire_message(index, raw_messages[index], ids[index], names):
            names.update((c.id, c.name) for c in message.tool_calls)
            out.append(message)
    check_tool_pairing(out)
    return out


def reusable_prefix(
    fmt: WireFormat,
    earlier: list[dict[str, Any]],
    raw_messages: list[dict[str, Any]],
) -> int:
    """How many leading wire messages of ``raw_messages`` normalize exactly as those of an
    earlier snapshot (same format and system prompt) did: equal, and of a kind for which equal
    means the same normalized message."""
    reusable = _MODULES[fmt].reusable
    count = 0
    for old, new in zip(earlier, raw_messages, strict=False):
        if old != new or not reusable(new):
            break
        count += 1
    return count


def check_tool_pairing(messages: list[Message]) -> None:
    """Every tool result answers an earlier call, once; every call id is unique."""
    calls: dict[str, str] = {}
    answered: set[str] = set()
    for m in messages:
        for call in m.tool_calls:
            if call.id in calls:
                raise InvalidSnapshot(_where(m), f"duplicate tool call id {call.id!r}")
            calls[call.id] = call.name
        if m.role == "tool":
            cid = m.tool_call_id or ""
            if cid not in calls:
                raise InvalidSnapshot(
                    _where(m), f"tool result {cid!r} answers no earlier tool call"
                )
            if cid in answered:
                raise InvalidSnapshot(_where(m), f"second result for tool call {cid!r}")
            answered.add(cid)


def _where(m: Message) -> str:
    return f"messages[{m.source_index}]" if m.source_index >= 0 else "system"


def render(fmt: WireFormat, messages: list[Message], *, with_ids: bool) -> list[dict[str, Any]]:
    rendered: list[dict[str, Any]] = _MODULES[fmt].render(messages, with_ids=with_ids)
    return rendered


def text_message(fmt: WireFormat, role: str, text: str, *, msg_id: str | None) -> dict[str, Any]:
    out: dict[str, Any] = _MODULES[fmt].text_message(role, text, msg_id=msg_id)
    return out


def replace_tool_results(
    fmt: WireFormat, raw_messages: list[dict[str, Any]], bodies: dict[str, str]
) -> list[dict[str, Any]]:
    """Copies of ``raw_messages`` with the results of the given call ids replaced by new text."""
    out: list[dict[str, Any]] = _MODULES[fmt].replace_tool_results(raw_messages, bodies)
    return out
