"""A session for the OpenAI Agents SDK that hands back the compacted history.

:class:`CompactingAgentSession` wraps any SDK session (``SQLiteSession``, a Redis or SQLAlchemy
session, ...). ``add_items`` stores the items in the wrapped session (which keeps the full
history, as the user expects) and submits them through a :class:`worker.session.
CompactingSession`; ``get_items`` applies the compactions that have arrived and returns the
compacted view, which the Runner sends to the model. Neither waits for Redis or a worker.

The SDK's items are OpenAI Responses API input items; the service is given them as Chat
Completions messages (``format="openai"``), each carrying the items it came from under
:data:`EXTRA_KEY`, so every item the compaction keeps comes back exactly as it was stored (a
tool result the projection shortened comes back with the shortened ``output``). A run of
assistant-side items (reasoning, a message, function calls) is one assistant message, so the
service never separates a call from the turn that made it; each output is a tool message.
:func:`to_wire` and :func:`from_wire` are these conversions.

``items_to_chat``, ``chat_to_items`` and ``ITEMS_KEY`` are the old names of :func:`to_wire`,
:func:`from_wire` and :data:`EXTRA_KEY`; they still work.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from worker.client import Client
from worker.session import CompactingSession

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import Session, SessionSettings

__all__ = ["EXTRA_KEY", "CompactingAgentSession", "from_wire", "to_wire"]

log = logging.getLogger(__name__)

EXTRA_KEY = "x_responses_items"  # the Responses items a chat message stands for
_OUTPUT_TYPES = {  # items that answer a call, by call_id
    "function_call_output",
    "custom_tool_call_output",
    "computer_call_output",
    "local_shell_call_output",
    "shell_call_output",
    "apply_patch_call_output",
}


class CompactingAgentSession:
    """An Agents SDK session (the ``Session`` protocol) whose ``get_items`` is compacted.

    ``inner`` keeps every item; this session submits them to the compaction service as the
    conversation ``conversation_id`` (default: ``inner.session_id``) and answers ``get_items``
    with the history as compacted so far. Its background work runs on threads (a
    :class:`worker.session.CompactingSession`), so it serves any event loop: ``Runner.run``,
    ``Runner.run_sync``, one ``asyncio.run`` after another. ``options`` go to
    :class:`worker.session.CompactingSession` (``model``, ``context_window``, ``config``,
    ``tools``, ...). Call :meth:`close` (or use ``async with``) when done."""

    def __init__(
        self,
        inner: Session,
        *,
        client: Client | None = None,
        conversation_id: str | None = None,
        model: str | None = None,
        context_window: int | None = None,
        **options: Any,
    ) -> None:
        self.inner = inner
        self.session_id: str = inner.session_id
        self.session_settings: SessionSettings | None = getattr(inner, "session_settings", None)
        self._owns_client = client is None
        self.client = client if client is not None else Client()
        self.compacting = CompactingSession(
            conversation_id or inner.session_id,
            client=self.client,
            format="openai",
            model=model,
            context_window=context_window,
            **options,
        )
        self._loaded = False

    async def _load(self) -> None:
        """The first call submits what the wrapped session already holds."""
        if self._loaded:
            return
        self._loaded = True
        existing = await self.inner.get_items()
        if existing:
            self.compacting.extend(to_wire(existing))

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The compacted history (the newest ``limit`` items of it, when given)."""
        await self._load()
        items = from_wire(self.compacting.request_messages())
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        fresh: list[Any] = copy.deepcopy(items)  # the session's own are shared: never hand them out
        return fresh

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        await self._load()
        await self.inner.add_items(items)
        plain = [_plain(item) for item in items]
        if plain:
            self.compacting.extend(to_wire(plain))

    async def pop_item(self) -> TResponseInputItem | None:
        await self._load()
        item = await self.inner.pop_item()
        if item is None:
            return None
        messages = self.compacting.messages
        originals = messages[-1].get(EXTRA_KEY) if messages else None
        if isinstance(originals, list) and originals and originals[-1] == _plain(item):
            self.compacting.replace_messages([*messages[:-1], *to_wire(originals[:-1])])
        else:  # the item is not the newest one we hold (compacted away): start from the store
            log.info("pop_item: %s resynchronised from the wrapped session", self.session_id)
            self.compacting.replace_messages(to_wire(await self.inner.get_items()))
        return item

    async def clear_session(self) -> None:
        await self.inner.clear_session()
        self.compacting.replace_messages([])

    def close(self) -> None:
        """Stop the background threads (an unsent snapshot gets a moment to go out)."""
        self.compacting.close()
        if self._owns_client:
            self.client.close()

    async def __aenter__(self) -> CompactingAgentSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


# --- Responses items <-> Chat Completions messages ------------------------------------------


def to_wire(items: Iterable[Any]) -> list[dict[str, Any]]:
    """Chat Completions messages for Responses input items, each holding its items under
    :data:`EXTRA_KEY`."""
    out: list[dict[str, Any]] = []
    group: list[dict[str, Any]] = []  # assistant-side items not yet flushed

    def flush() -> None:
        if group:
            out.append(_assistant(group))
            group.clear()

    for raw in items:
        item = _plain(raw)
        kind = item.get("type")
        role = item.get("role")
        if kind in _OUTPUT_TYPES or (kind and kind.endswith("_call_output") and "call_id" in item):
            flush()
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item["call_id"]),
                    "content": _output_text(item.get("output")),
                    EXTRA_KEY: [item],
                }
            )
        elif role in ("user", "system", "developer") and kind in (None, "message"):
            flush()
            out.append({"role": role, "content": _text(item.get("content")), EXTRA_KEY: [item]})
        else:  # assistant messages, reasoning, calls, hosted tool items
            group.append(item)
    flush()
    return out


def from_wire(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Responses items of (projected, compacted) chat messages: a message's own items,
    or new items for a message the service wrote (a summary)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        originals = m.get(EXTRA_KEY)
        if isinstance(originals, list) and originals:
            if m.get("role") == "tool" and len(originals) == 1:
                item = originals[0]
                if m.get("content") != _output_text(item.get("output")):  # shortened
                    item = {**item, "output": m.get("content") or ""}
                items.append(item)
            else:
                items.extend(originals)
            continue
        items.extend(_new_items(m))
    return items


def _new_items(m: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = m.get("role"), m.get("content")
    text = content if isinstance(content, str) else _text(content)
    if role == "tool":
        return [{"type": "function_call_output", "call_id": m["tool_call_id"], "output": text}]
    out: list[dict[str, Any]] = []
    if role == "assistant":
        if text:
            out.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        for call in m.get("tool_calls") or ():
            fn = call["function"]
            out.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": fn["name"],
                    "arguments": fn.get("arguments", ""),
                }
            )
        return out
    return [{"role": role if role in ("user", "system", "developer") else "user", "content": text}]


def _assistant(group: list[dict[str, Any]]) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in group:
        kind = item.get("type")
        if kind == "reasoning":
            reasoning += [
                s.get("text", "") for s in item.get("summary") or () if isinstance(s, dict)
            ]
            reasoning += [
                c.get("text", "") for c in item.get("content") or () if isinstance(c, dict)
            ]
        elif kind in (None, "message"):
            texts.append(_text(item.get("content")))
        elif kind in ("function_call", "custom_tool_call") or (
            isinstance(kind, str) and kind.endswith("_call") and "call_id" in item
        ):
            if kind == "function_call":
                name, arguments = item.get("name"), item.get("arguments", "")
            elif kind == "custom_tool_call":
                name, arguments = item.get("name"), item.get("input", "")
            else:  # computer, shell, ... calls: the action is the arguments
                name = kind
                arguments = json.dumps(
                    {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}
                )
            calls.append(
                {
                    "id": str(item["call_id"]),
                    "type": "function",
                    "function": {"name": str(name or kind), "arguments": str(arguments)},
                }
            )
        else:  # hosted tools (web search, file search, MCP, ...): counted as their JSON
            texts.append(json.dumps({k: v for k, v in item.items() if k != "id"}))
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(t for t in texts if t)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    message[EXTRA_KEY] = list(group)
    return message


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict):
            text = part.get("text", part.get("refusal"))
            if isinstance(text, str):
                texts.append(text)
    return "\n".join(texts)


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _text(output)
    return "" if output is None else json.dumps(output)


def _plain(item: Any) -> dict[str, Any]:
    """An item as plain JSON (the SDK may hand over pydantic models)."""
    if hasattr(item, "model_dump"):
        item = item.model_dump(mode="json", exclude_none=True)
    plain: dict[str, Any] = json.loads(json.dumps(item, default=str))
    return plain


# The names of earlier releases, kept: they still work (docs/integrations.md, "Names").
items_to_chat = to_wire
chat_to_items = from_wire
ITEMS_KEY = EXTRA_KEY
