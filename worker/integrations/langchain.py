"""LangChain and LangGraph: compaction in the background for ``create_agent`` and
``create_react_agent`` (the ``langchain`` extra; docs/integrations.md).

- :class:`CompactingMiddleware` for ``langchain.agents.create_agent(..., middleware=[...])``:
  before each model call it applies the compactions that have arrived and gives the model the
  compacted history; after the call it submits the new messages (those the model was given
  for the first time, and its answer). The agent's state keeps the full history.
- :class:`CompactingPreModelHook` for ``langgraph.prebuilt.create_react_agent(...,
  pre_model_hook=...)``: the same, returning ``{"llm_input_messages": [...]}``; it submits the
  new messages as it hands them to the model.
- :func:`to_wire` / :func:`from_wire`: LangChain messages <-> the ``openai`` wire format a
  :class:`~worker.session.CompactingSession` keeps, losslessly for system, human, AI (tool calls,
  content blocks) and tool messages; a message's ``.id`` is its wire ``id``.

What LangChain keeps and Chat Completions has no field for (``additional_kwargs``,
``response_metadata``, ``usage_metadata``, ``invalid_tool_calls``, a tool message's ``status``
and ``artifact``, content blocks that are not Chat Completions parts) travels under the key
:data:`EXTRA_KEY` (``"langchain"``), of the message or of a content part, which the worker
passes through untouched.

``CompactionMiddleware``, ``CompactionHook`` and ``EXTENSION`` are the old names of
:class:`CompactingMiddleware`, :class:`CompactingPreModelHook` and :data:`EXTRA_KEY`; they
still work.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from langchain.agents.middleware import types as _middleware_types
from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool, StructuredTool

from worker.session import (
    COMPACT_DESCRIPTION,
    COMPACT_TOOL_NAME,
    RECALL_TOOL_NAME,
    CompactingSession,
)

__all__ = [
    "EXTRA_KEY",
    "CompactingMiddleware",
    "CompactingPreModelHook",
    "SessionSource",
    "from_wire",
    "to_wire",
]

log = logging.getLogger(__name__)

EXTRA_KEY = "langchain"  # the key of what Chat Completions has no field for
_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_PASS_THROUGH = {"image_url", "input_audio", "file"}  # Chat Completions parts, kept as they are
_TEXT_KEYS = ("text", "thinking", "reasoning")  # a block's text the worker should count
_RECALL_DESCRIPTION = (
    "Fetch the full original of a message that was compacted into a "
    "'[compaction-worker summary]': give its message id or a tool call id (argument 'id'). "
    "Returns the message as JSON."
)


# --- conversion -----------------------------------------------------------------------------


def to_wire(messages: Iterable[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as ``openai`` wire messages (new dicts; JSON values only).

    Raises TypeError for a message class other than System/Human/AI/ToolMessage (chunks
    included) or content that is not JSON, ValueError for a tool call without an id. Values of
    ``additional_kwargs``, ``response_metadata`` and ``artifact`` that are not JSON are left out
    (they stay on the agent's own message)."""
    return [_message_to_wire(m) for m in messages]


def from_wire(messages: Iterable[Mapping[str, Any]]) -> list[BaseMessage]:
    """``openai`` wire messages as LangChain messages: the inverse of :func:`to_wire`. Also
    reads wire messages it did not write (a compaction's summary, a role ``developer``)."""
    return [_message_from_wire(m) for m in messages]


def _message_to_wire(m: BaseMessage) -> dict[str, Any]:
    role = _ROLES.get(m.type)
    if role is None or type(m) not in (SystemMessage, HumanMessage, AIMessage, ToolMessage):
        raise TypeError(f"cannot convert a {type(m).__name__} to a wire message")
    wire: dict[str, Any] = {} if m.id is None else {"id": m.id}
    wire["role"] = role
    wire["content"] = _content_to_wire(m.content)
    if m.name is not None:
        wire["name"] = m.name
    extra: dict[str, Any] = {}
    if m.additional_kwargs:
        _keep_json(extra, "additional_kwargs", m.additional_kwargs, m)
    if m.response_metadata:
        _keep_json(extra, "response_metadata", m.response_metadata, m)
    if isinstance(m, AIMessage):
        if m.tool_calls:
            wire["tool_calls"] = [_call_to_wire(c) for c in m.tool_calls]
        if m.invalid_tool_calls:
            extra["invalid_tool_calls"] = [dict(c) for c in m.invalid_tool_calls]
        if m.usage_metadata is not None:
            extra["usage_metadata"] = json.loads(json.dumps(m.usage_metadata))
    elif isinstance(m, ToolMessage):
        wire["tool_call_id"] = m.tool_call_id
        if m.status != "success":
            extra["status"] = m.status
        if m.artifact is not None:
            _keep_json(extra, "artifact", m.artifact, m)
    if extra:
        wire[EXTRA_KEY] = extra
    return wire


def _keep_json(extra: dict[str, Any], key: str, value: Any, m: BaseMessage) -> None:
    try:
        extra[key] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        log.debug("leaving %s of message %s out of the wire form: not JSON", key, m.id)


def _call_to_wire(call: Mapping[str, Any]) -> dict[str, Any]:
    if not call.get("id"):
        raise ValueError(f"tool call {call.get('name')!r} has no id: the service needs one")
    return {
        "id": call["id"],
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": json.dumps(call["args"], ensure_ascii=False, allow_nan=False),
        },
    }


def _content_to_wire(content: Any) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TypeError(f"message content is a str or a list, not {type(content).__name__}")
    parts = [_block_to_wire(b) for b in content]
    try:
        json.dumps(parts, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"message content is not JSON: {exc}") from None
    return parts


def _block_to_wire(block: Any) -> dict[str, Any]:
    if isinstance(block, str):
        return {"type": "text", "text": block, EXTRA_KEY: {"str": True}}
    if not isinstance(block, dict):
        raise TypeError(f"a content block is a str or a dict, not {type(block).__name__}")
    kind = block.get("type")
    if EXTRA_KEY not in block:
        if kind in ("text", "refusal") and isinstance(block.get(kind), str):
            return dict(block)
        if kind in _PASS_THROUGH:
            return dict(block)
        if kind == "image":
            source = next((k for k in ("url", "base64") if isinstance(block.get(k), str)), None)
            if source is not None:
                rest = {k: v for k, v in block.items() if k != source}
                if source == "url":
                    url = block["url"]
                else:
                    mime = block.get("mime_type") or "application/octet-stream"
                    url = f"data:{mime};base64,{block['base64']}"
                return {
                    "type": "image_url",
                    "image_url": {"url": url},
                    EXTRA_KEY: {"block": rest, "image": source},
                }
    # Anything else (reasoning, a tool_call block, audio, a provider's own block): a text part
    # carrying the block, its text (if any) where the worker counts it.
    key = next((k for k in _TEXT_KEYS if isinstance(block.get(k), str)), None)
    ext: dict[str, Any] = {"block": {k: v for k, v in block.items() if k != key}}
    if key is not None:
        ext["text_key"] = key
    return {"type": "text", "text": block[key] if key is not None else "", EXTRA_KEY: ext}


def _content_from_wire(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return [_block_from_wire(p) for p in content]


def _block_from_wire(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    ext = part.get(EXTRA_KEY)
    if not isinstance(ext, dict):
        return dict(part)
    if ext.get("str"):
        return part["text"]
    block = dict(ext["block"])
    if "image" in ext:
        url = part["image_url"]["url"]
        block[ext["image"]] = url.split(",", 1)[1] if ext["image"] == "base64" else url
    elif "text_key" in ext:
        block[ext["text_key"]] = part["text"]
    return block


def _message_from_wire(w: Mapping[str, Any]) -> BaseMessage:
    role = w.get("role")
    ext = w.get(EXTRA_KEY)
    ext = ext if isinstance(ext, dict) else {}
    common: dict[str, Any] = {
        "content": _content_from_wire(w.get("content")),
        "id": w.get("id"),
        "name": w.get("name"),
        "additional_kwargs": ext.get("additional_kwargs", {}),
        "response_metadata": ext.get("response_metadata", {}),
    }
    if role in ("system", "developer"):
        return SystemMessage(**common)
    if role == "user":
        return HumanMessage(**common)
    if role == "assistant":
        calls, invalid = [], list(ext.get("invalid_tool_calls", ()))
        for c in w.get("tool_calls") or ():
            fn = c.get("function") or {}
            arguments = fn.get("arguments") or "{}"
            try:
                args = json.loads(arguments)
            except ValueError as exc:
                args = None
                error = f"arguments are not JSON: {exc}"
            if isinstance(args, dict):
                calls.append({"name": fn.get("name"), "args": args, "id": c.get("id")})
            else:
                invalid.append(
                    {
                        "name": fn.get("name"),
                        "args": arguments,
                        "id": c.get("id"),
                        "error": error if args is None else "arguments are not a JSON object",
                        "type": "invalid_tool_call",
                    }
                )
        return AIMessage(
            **common,
            tool_calls=calls,
            invalid_tool_calls=invalid,
            usage_metadata=ext.get("usage_metadata"),
        )
    if role == "tool":
        return ToolMessage(
            **common,
            tool_call_id=w["tool_call_id"],
            status=ext.get("status", "success"),
            artifact=ext.get("artifact"),
        )
    raise ValueError(f"unknown wire role {role!r}")


# --- keeping a session in step with an agent's messages -------------------------------------


class _Feed:
    """One conversation: which of the agent's messages the session has, and what the model
    is given instead of the agent's history."""

    def __init__(self, session: CompactingSession) -> None:
        if session.format != "openai":
            raise ValueError("the LangChain adapter needs a session of format 'openai'")
        self.session = session
        self._ids: list[str | None] = []  # the agent's messages the session has, in order
        self._wire: dict[str, dict[str, Any]] = {}  # their wire form, by id
        self._lock = threading.Lock()

    def model_input(
        self, messages: Sequence[BaseMessage]
    ) -> tuple[list[BaseMessage], list[BaseMessage]]:
        """(the messages to give the model, those of ``messages`` the session does not have
        yet). Applies the compactions that have arrived; never waits for the service."""
        with self._lock:
            known = len(self._ids)
            if len(messages) < known or [m.id for m in messages[:known]] != self._ids:
                # The agent's history is not the one we fed (edited, trimmed, another run):
                # the session starts again from it; compactions of the old one are skipped.
                log.info(
                    "%s: the agent's history changed; submitting it whole",
                    self.session.conversation_id,
                )
                self._ids, self._wire = [], {}
                self._replace(messages)
                tail: list[BaseMessage] = []
            else:
                tail = list(messages[known:])
            projected = self.session.request_messages()
            carried = {i for e in self.session.compactions for i in e.compaction.preserved_ids}
        originals: dict[str, BaseMessage] = {m.id: m for m in messages if m.id is not None}
        out: list[BaseMessage] = []
        for raw in projected:
            mid = raw.get("id")
            mid = mid if isinstance(mid, str) else ""
            original = originals.get(mid)
            # The agent's own object where the session has it unchanged, or re-rendered by a
            # compaction that carried it over; a summary or an edited tool result converted.
            if original is not None and (mid in carried or self._wire.get(mid) == raw):
                out.append(original)
            else:
                out.append(_message_from_wire(raw))
        return out + tail, tail

    def _replace(self, messages: Sequence[BaseMessage]) -> None:
        wire = to_wire(messages)
        self.session.replace_messages(wire)
        self._record(messages, wire)

    def submit(self, new: Sequence[BaseMessage]) -> None:
        """Append messages to the session (it submits them in the background)."""
        if not new:
            return
        wire = to_wire(new)
        with self._lock:
            self.session.extend(wire)
            self._record(new, wire)

    def _record(self, messages: Sequence[BaseMessage], wire: list[dict[str, Any]]) -> None:
        for m, raw in zip(messages, wire, strict=True):
            self._ids.append(m.id)
            if m.id is not None:
                self._wire[m.id] = raw


SessionSource = CompactingSession | Callable[[str], CompactingSession]


class _Sessions:
    """One session, or one per LangGraph thread (``config["configurable"]["thread_id"]``)."""

    def __init__(self, source: SessionSource) -> None:
        self._single = source if isinstance(source, CompactingSession) else None
        self._factory = None if isinstance(source, CompactingSession) else source
        self._feeds: dict[str, _Feed] = {}
        self._lock = threading.Lock()
        if self._single is not None:
            self._feeds[""] = _Feed(self._single)

    def feed(self, thread_id: str | None = None) -> _Feed:
        if self._single is not None:
            return self._feeds[""]
        key = thread_id or _thread_id()
        with self._lock:
            feed = self._feeds.get(key)
            if feed is None:
                assert self._factory is not None
                feed = self._feeds[key] = _Feed(self._factory(key))
            return feed

    def sessions(self) -> list[CompactingSession]:
        with self._lock:
            return [f.session for f in self._feeds.values()]

    def recall_tool(self) -> BaseTool:
        sessions = self

        def recall_message(id: str) -> str:
            answer: str = sessions.feed().session.recall_tool().handler({"id": id})
            return answer

        return StructuredTool.from_function(
            recall_message, name=RECALL_TOOL_NAME, description=_RECALL_DESCRIPTION
        )

    def compact_tool(self) -> BaseTool:
        sessions = self

        def compact_history(instructions: str | None = None) -> str:
            tool = sessions.feed().session.compact_tool()
            answer: str = tool.handler({"instructions": instructions})
            return answer

        return StructuredTool.from_function(
            compact_history, name=COMPACT_TOOL_NAME, description=COMPACT_DESCRIPTION
        )


def _thread_id() -> str:
    from langgraph.config import get_config

    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # not inside a graph run
        configurable = {}
    thread_id = configurable.get("thread_id")
    if not thread_id:
        raise ValueError(
            "a per-thread session needs config={'configurable': {'thread_id': ...}}; "
            "or pass one CompactingSession"
        )
    return str(thread_id)


def _with_ids(messages: Iterable[BaseMessage]) -> list[BaseMessage]:
    """The messages, each given an id if it had none (the one the agent's state will keep)."""
    out = list(messages)
    for m in out:
        if m.id is None:
            m.id = str(uuid.uuid4())
    return out


# A model response with a state update; not in every langchain 1.x.
_EXTENDED = getattr(_middleware_types, "ExtendedModelResponse", None)


def _response_messages(response: Any) -> list[BaseMessage]:
    if _EXTENDED is not None and isinstance(response, _EXTENDED):
        response = response.model_response
    if isinstance(response, ModelResponse):
        return list(response.result)
    if isinstance(response, AIMessage):
        return [response]
    return []


class CompactingMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Compaction for ``langchain.agents.create_agent``: the model is given the compacted
    history (compactions that have arrived applied before each call), the agent's state keeps
    every message, and after each model call the new messages are submitted.

    ``session``: a :class:`~worker.session.CompactingSession` (format ``openai``) for one
    conversation, or a function from a LangGraph ``thread_id`` to a session (one per thread,
    made on first use). ``recall_tool=True`` registers a ``recall_message`` tool with which the
    model fetches a compacted message by id. The system prompt is passed to the model as it is
    and is not part of the compacted history. Put this middleware last in ``middleware=[...]``
    when others edit ``request.messages`` too (it then sees their edits, and is the innermost
    wrapper around the model call)."""

    def __init__(self, session: SessionSource, *, recall_tool: bool = False) -> None:
        super().__init__()
        self._sessions = _Sessions(session)
        self.tools: list[BaseTool] = [self._sessions.recall_tool()] if recall_tool else []

    @property
    def sessions(self) -> list[CompactingSession]:
        """The sessions in use (one, or one per thread seen so far)."""
        return self._sessions.sessions()

    def compact_tool(self) -> BaseTool:
        """The ``compact_history`` tool (the model compacts its own history now, optionally
        saying what to keep), to add to the agent's tools."""
        return self._sessions.compact_tool()

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> Any:
        feed = self._sessions.feed()
        messages, new = feed.model_input(request.messages)
        response = handler(request.override(messages=cast("list[AnyMessage]", messages)))
        feed.submit([*new, *_with_ids(_response_messages(response))])
        return response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> Any:
        feed = self._sessions.feed()
        messages, new = feed.model_input(request.messages)  # no I/O: never waits
        response = await handler(request.override(messages=cast("list[AnyMessage]", messages)))
        feed.submit([*new, *_with_ids(_response_messages(response))])
        return response


class CompactingPreModelHook:
    """A ``pre_model_hook`` for ``langgraph.prebuilt.create_react_agent``: returns
    ``{"llm_input_messages": <the compacted history>}`` and submits the messages it sees for
    the first time (the model's previous answer and the tool results since). The state's
    ``messages`` are not changed.

    ``session``: as for :class:`CompactingMiddleware`. The final answer of a run is submitted
    by the next run's first model call, or by :meth:`flush` with the run's messages."""

    def __init__(self, session: SessionSource) -> None:
        self._sessions = _Sessions(session)

    @property
    def sessions(self) -> list[CompactingSession]:
        return self._sessions.sessions()

    def recall_tool(self) -> BaseTool:
        """The ``recall_message`` tool, to add to the agent's tools."""
        return self._sessions.recall_tool()

    def compact_tool(self) -> BaseTool:
        """The ``compact_history`` tool, to add to the agent's tools."""
        return self._sessions.compact_tool()

    def __call__(self, state: Any) -> dict[str, Any]:
        messages = state["messages"] if isinstance(state, Mapping) else state.messages
        feed = self._sessions.feed()
        model_input, new = feed.model_input(messages)
        feed.submit(new)
        return {"llm_input_messages": model_input}

    def flush(self, messages: Sequence[BaseMessage], *, thread_id: str | None = None) -> None:
        """Submit what of ``messages`` (the agent's history, e.g. a run's result
        ``["messages"]``) the session does not have yet; outside a run, a per-thread hook
        needs the ``thread_id``."""
        feed = self._sessions.feed(thread_id)
        _, new = feed.model_input(messages)
        feed.submit(new)


# The names of earlier releases, kept: they still work (docs/integrations.md, "Names").
CompactionMiddleware = CompactingMiddleware
CompactionHook = CompactingPreModelHook
EXTENSION = EXTRA_KEY
