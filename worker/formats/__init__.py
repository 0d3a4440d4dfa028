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


def source_ids(raw_messages: list[dict[str, Any]]) -> list[str]:
    """Each wire message's id: its own ``id`` when it has one, else a stable derived id."""
    ids: list[str] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_messages):
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
) -> list[Message]:
    """Validate and normalize; ``ids`` are the wire messages' ids when already computed."""
    ids = source_ids(raw_messages) if ids is None else ids
    messages: list[Message] = _MODULES[fmt].to_messages(raw_messages, ids, system=system)
    check_tool_pairing(messages)
    return messages


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
