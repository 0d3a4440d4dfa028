"""A context provider for Microsoft Agent Framework that supplies the compacted history.

:class:`CompactingContextProvider` goes where Agent Framework's own ``CompactionProvider``
goes: in ``context_providers``, after the history provider whose messages it compacts. Before
a run it hands the history (as that provider loaded it) to a :class:`worker.session.
CompactingSession`, applies the compactions that have arrived and replaces the loaded messages
with the compacted ones; after the run it submits the run's messages. The model gets the
compacted history; the history provider keeps storing every message. Neither step waits for
Redis or a worker: compaction happens in the background, between runs.

Messages are converted to Chat Completions messages (``format="openai"``): text and images
(``data``/``uri`` contents) as content parts, ``text_reasoning`` as ``reasoning_content``,
function calls as ``tool_calls`` and each function result as a ``tool`` message. What the
format has no field for (the message's role, author, id and properties except the per-run
``_attribution``, each content's other fields, contents of other types) rides along under
:data:`EXTRA_KEY`, so :func:`from_wire` gives back the same messages; a tool result the
projection shortened comes back shortened. A message's function results come back after its
other contents.

``to_openai`` and ``from_openai`` are the old names of :func:`to_wire` and :func:`from_wire`;
they still work.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from agent_framework import Content, ContextProvider, Message

from worker.client import Client
from worker.session import CompactingSession

__all__ = ["EXTRA_KEY", "CompactingContextProvider", "from_wire", "to_wire"]

log = logging.getLogger(__name__)

EXTRA_KEY = "x_agent_framework"
_ATTRIBUTION = "_attribution"  # which provider loaded a message: per run, not submitted
_ROLES = {"system", "user", "assistant", "tool"}


class CompactingContextProvider(ContextProvider):
    """Keeps each agent session's history compact through the compaction service.

    ``history_source_id`` names the history provider whose loaded messages are compacted
    (``InMemoryHistoryProvider``'s is ``"in_memory"``); list this provider after it. Each
    ``AgentSession`` is the conversation ``conversation_prefix + session.session_id``.
    ``options`` go to :class:`worker.session.CompactingSession` (``model``,
    ``context_window``, ``config``, ...). :meth:`close` stops the background threads."""

    def __init__(
        self,
        *,
        client: Client | None = None,
        history_source_id: str = "in_memory",
        source_id: str = "compactor",
        conversation_prefix: str = "",
        model: str | None = None,
        context_window: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(source_id)
        self.history_source_id = history_source_id
        self.conversation_prefix = conversation_prefix
        self._owns_client = client is None
        self.client = client if client is not None else Client()
        self._options = dict(options, model=model, context_window=context_window)
        # per agent session: (its compacting session, how many history messages it was given)
        self._sessions: dict[str, list[Any]] = {}

    def compacting_session(self, session: Any) -> CompactingSession:
        """The :class:`CompactingSession` of an agent session (made on first use)."""
        return self._entry(session)[0]  # type: ignore[no-any-return]

    def _entry(self, session: Any) -> list[Any]:
        key = str(getattr(session, "session_id", None) or "default")
        entry = self._sessions.get(key)
        if entry is None:
            compacting = CompactingSession(
                self.conversation_prefix + key, client=self.client, format="openai", **self._options
            )
            entry = self._sessions[key] = [compacting, 0]
        return entry

    async def before_run(
        self, *, agent: Any, session: Any, context: Any, state: dict[str, Any]
    ) -> None:
        """Replace the loaded history with its compacted form."""
        history: list[Message] = list(context.context_messages.get(self.history_source_id) or [])
        entry = self._entry(session)
        compacting: CompactingSession = entry[0]
        if len(history) > entry[1]:  # new to us (the first run, or written by someone else)
            compacting.extend(to_wire(history[entry[1] :]))
        elif len(history) < entry[1]:  # the store was cleared or edited: start from it again
            log.info("history of %s shrank: resubmitting it", compacting.conversation_id)
            compacting.replace_messages(to_wire(history))
        entry[1] = len(history)
        if not history:
            return
        compacted = from_wire(compacting.request_messages())
        attribution = history[0].additional_properties.get(_ATTRIBUTION) or {
            "source_id": self.history_source_id
        }
        for message in compacted:  # attributed to the history provider, as loaded
            message.additional_properties.setdefault(_ATTRIBUTION, dict(attribution))
        context.context_messages[self.history_source_id] = compacted

    async def after_run(
        self, *, agent: Any, session: Any, context: Any, state: dict[str, Any]
    ) -> None:
        """Submit the run's input and response messages."""
        new = list(context.input_messages or [])
        if context.response is not None:
            new += list(context.response.messages or [])
        if new:
            entry = self._entry(session)
            entry[0].extend(to_wire(new))
            entry[1] += len(new)

    def close(self) -> None:
        for compacting, _ in self._sessions.values():
            compacting.close()
        self._sessions.clear()
        if self._owns_client:
            self.client.close()


# --- Message <-> Chat Completions messages ---------------------------------------------------


def to_wire(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Chat Completions messages for Agent Framework messages (see the module's docstring)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        out += _message_to_wire(message)
    return out


def _message_to_wire(message: Message) -> list[dict[str, Any]]:
    whole = _json(message.to_dict())
    meta = {k: v for k, v in whole.items() if k not in ("type", "contents")}
    properties = meta.get("additional_properties")
    if isinstance(properties, dict) and _ATTRIBUTION in properties:
        meta["additional_properties"] = {k: v for k, v in properties.items() if k != _ATTRIBUTION}
    parts: list[dict[str, Any]] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    template: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for content in whole.get("contents") or ():
        kind = content.get("type")
        if kind == "text" and isinstance(content.get("text"), str):
            template.append({"part": len(parts), "rest": _without(content, "text")})
            parts.append({"type": "text", "text": content["text"]})
        elif kind in ("data", "uri") and isinstance(content.get("uri"), str):
            template.append({"part": len(parts), "rest": _without(content, "uri")})
            if str(content.get("media_type") or "").startswith("image/"):
                parts.append({"type": "image_url", "image_url": {"url": content["uri"]}})
            else:
                parts.append({"type": "file", "file": {"file_data": content["uri"]}})
        elif kind == "text_reasoning" and isinstance(content.get("text"), str):
            reasoning.append(content["text"])
            template.append({"content": content})
        elif kind == "function_call" and content.get("call_id") and content.get("name"):
            arguments = content.get("arguments")
            template.append(
                {
                    "call": len(calls),
                    "rest": _without(content, "call_id", "name", "arguments"),
                    "mapping": not isinstance(arguments, str) and arguments is not None,
                }
            )
            calls.append(
                {
                    "id": str(content["call_id"]),
                    "type": "function",
                    "function": {
                        "name": str(content["name"]),
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments or {}),
                    },
                }
            )
        elif kind == "function_result" and content.get("call_id"):
            results.append(content)
        else:  # hosted tools, errors, usage, approvals, ...: kept as they are
            template.append({"content": content})
    out: list[dict[str, Any]] = []
    role = message.role if message.role in _ROLES else "user"
    if template or not results:
        chat: dict[str, Any] = {"role": "assistant" if role == "tool" else role}
        chat["content"] = _content(parts)
        if reasoning and chat["role"] == "assistant":
            chat["reasoning_content"] = "\n".join(reasoning)
        if calls and chat["role"] == "assistant":
            chat["tool_calls"] = calls
        elif calls:  # a call outside an assistant message: kept, not counted as one
            template = [t if "call" not in t else {"content": _call_of(t, calls)} for t in template]
        chat[EXTRA_KEY] = {"message": meta, "contents": template}
        out.append(chat)
    for k, result in enumerate(results):
        extra: dict[str, Any] = {"result": _without(result, "call_id")}
        if out or k:
            extra["continues"] = True
        else:
            extra["message"] = meta
        out.append(
            {
                "role": "tool",
                "tool_call_id": str(result["call_id"]),
                "content": _result_text(result),
                EXTRA_KEY: extra,
            }
        )
    return out


def from_wire(messages: Sequence[dict[str, Any]]) -> list[Message]:
    """Agent Framework messages for (projected, compacted) Chat Completions messages: the
    messages :func:`to_wire` made, as they were, and new ones for what the service wrote."""
    out: list[Message] = []
    for chat in messages:
        extra = chat.get(EXTRA_KEY)
        if not isinstance(extra, dict):
            out.append(_new_message(chat))
            continue
        if chat.get("role") == "tool":
            result = _result_from(chat, extra["result"])
            if extra.get("continues") and out and _continues(out[-1]):
                out[-1].contents.append(Content.from_dict(result))
                continue
            meta = extra.get("message") or {"role": "tool"}
            out.append(Message.from_dict({**meta, "type": "message", "contents": [result]}))
            continue
        parts = chat.get("content")
        parts = [{"type": "text", "text": parts}] if isinstance(parts, str) else parts or []
        calls = chat.get("tool_calls") or []
        contents: list[dict[str, Any]] = []
        for entry in extra.get("contents") or ():
            if "content" in entry:
                contents.append(entry["content"])
            elif "part" in entry:
                contents.append(_content_of(parts[entry["part"]], entry["rest"]))
            elif "call" in entry:
                contents.append(_call_of(entry, calls))
        meta = extra.get("message") or {"role": chat.get("role", "user")}
        out.append(Message.from_dict({**meta, "type": "message", "contents": contents}))
    return out


def _continues(message: Message) -> bool:
    return bool(message.contents) and all(c.type == "function_result" for c in message.contents)


def _new_message(chat: dict[str, Any]) -> Message:
    """A message the service wrote (a summary, a kept user message) or a foreign one."""
    role = chat.get("role")
    content = chat.get("content")
    text = content if isinstance(content, str) else _parts_text(content)
    if role == "tool":
        return Message(
            "tool", [Content.from_function_result(str(chat.get("tool_call_id")), result=text)]
        )
    contents: list[Content] = [Content.from_text(text)] if text else []
    for call in chat.get("tool_calls") or ():
        fn = call.get("function") or {}
        contents.append(
            Content.from_function_call(
                call_id=str(call.get("id")),
                name=str(fn.get("name")),
                arguments=fn.get("arguments", ""),
            )
        )
    return Message(str(role) if role in _ROLES else "user", contents)


def _content_of(part: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "text":
        return {**rest, "text": part.get("text", "")}
    url = (part.get("image_url") or {}).get("url") or (part.get("file") or {}).get("file_data")
    return {**rest, "uri": url}


def _call_of(entry: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    call = calls[entry["call"]]
    arguments: Any = call["function"]["arguments"]
    if entry.get("mapping"):
        arguments = json.loads(arguments)
    return {
        **entry["rest"],
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": arguments,
    }


def _result_from(chat: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    text = chat.get("content")
    text = text if isinstance(text, str) else _parts_text(text)
    original = {**rest, "call_id": chat["tool_call_id"]}
    if _result_text(original) == text:
        return original
    # shortened by the projection: the text it left is the result
    shortened = {k: v for k, v in original.items() if k not in ("items", "result")}
    return {**shortened, "result": text, "items": [{"type": "text", "text": text}]}


def _result_text(result: dict[str, Any]) -> str:
    value = result.get("result")
    if isinstance(value, str):
        return value
    items = result.get("items")
    if value is None and isinstance(items, list):
        return "\n".join(str(i.get("text", "")) for i in items if isinstance(i, dict))
    return "" if value is None else json.dumps(value)


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    if not parts:
        return ""
    return parts


def _parts_text(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return "\n".join(
        str(p.get("text")) for p in content if isinstance(p, dict) and p.get("type") == "text"
    )


def _without(content: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in content.items() if k not in keys}


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# The names of earlier releases, kept: they still work (docs/integrations.md, "Names").
to_openai = to_wire
from_openai = from_wire
