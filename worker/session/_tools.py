"""The two tools a session gives the model, and what they need:

- **recall** (``session.recall_tool()``, ``recall_message``): the transcripts of applied
  compactions (a small cache, :class:`Transcripts`), and the tool that fetches a compacted
  message's original from them;
- **compact** (``session.compact_tool()``, ``compact_history``): the model asks for a
  compaction of its own conversation, optionally saying what the summary must keep. Calling it
  asks the service (``Client.compact_now``); the compaction arrives like any other and is
  applied before a later request, never in the middle of the current one.

Each tool comes in the shapes the providers take: Chat Completions (``openai``), the Messages
API (``anthropic``) and, for ``compact_history``, the Responses API / OpenAI Agents SDK
(``responses``); its ``handler`` takes the call's arguments (JSON text or a dict) and answers
text for the tool result.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.client import Client, RequestResult
from worker.errors import CompactorError
from worker.wire import formats
from worker.wire.events import CompletedEvent
from worker.wire.requests import MAX_INSTRUCTIONS_CHARS

from ._projection import tool_refs

RECALL_TOOL_NAME = "recall_message"
TRANSCRIPTS_KEPT = 16  # transcripts held in memory for recall

# (the original messages, where each message id and tool call id is among them)
Transcript = tuple[list[dict[str, Any]], dict[str, int]]


@dataclass(frozen=True)
class RecallTool:
    """A tool that lets the model fetch a compacted message by id.

    ``openai``: a Chat Completions tool (``{"type": "function", "function": {...}}``);
    ``anthropic``: a Messages API tool (``{"name", "description", "input_schema"}``);
    ``handler(arguments)``: the tool's answer (text), where ``arguments`` is the call's
    arguments as JSON text (OpenAI) or a dict (Anthropic). An async session's handler is a
    coroutine function."""

    name: str
    openai: dict[str, Any]
    anthropic: dict[str, Any]
    handler: Callable[[str | Mapping[str, Any]], Any]


class Transcripts:
    """The newest transcripts read, :data:`TRANSCRIPTS_KEPT` at most (thread-safe)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._lock = threading.Lock()  # not held while reading: a read may take long
        self._kept: OrderedDict[str, Transcript] = OrderedDict()

    def of(self, event: CompletedEvent) -> Transcript:
        """The event's original messages (sha256-checked) and where each id is among them."""
        with self._lock:
            kept = self._kept.get(event.event_id)
            if kept is not None:
                self._kept.move_to_end(event.event_id)
                return kept
        original = self._client.restore(event)
        transcript = original, _index(event, original)
        with self._lock:
            self._kept[event.event_id] = transcript
            while len(self._kept) > TRANSCRIPTS_KEPT:
                self._kept.popitem(last=False)
        return transcript


def _index(event: CompletedEvent, original: list[dict[str, Any]]) -> dict[str, int]:
    index: dict[str, int] = {}
    c = event.compaction
    for k, mid in enumerate(formats.source_ids(original)[c.start : c.end], start=c.start):
        index.setdefault(mid, k)
    for results in (True, False):  # a call id names its result first, else the call
        for k in range(c.start, c.end):
            for ref in tool_refs(original[k], results=results):
                index.setdefault(ref, k)
    return index


def recall_id(arguments: str | Mapping[str, Any]) -> str | None:
    """The message id a recall tool call asks for (None: the call is malformed)."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str | bytes) else arguments
        return str(args["id"])
    except (ValueError, TypeError, KeyError):
        return None


RECALL_USAGE = 'error: call with {"id": "<message id or tool call id>"}'


def recall_miss(message_id: str, gone: list[CompletedEvent]) -> str:
    """Why ``message_id`` cannot be recalled, for people and models alike: ``expired`` when a
    compaction whose transcript retention removed replaced it (as far as its event records),
    else not found (saying when older transcripts are gone, so it may have been in one)."""
    if any(e.compaction.names(message_id) for e in gone):
        return (
            f"expired: message {message_id!r} was compacted, and the transcript that kept its "
            "original has since been removed by transcript retention"
        )
    if gone:
        return (
            f"no kept transcript holds message {message_id!r} (the transcripts of "
            f"{len(gone)} earlier compactions have expired; it may have been in one of them)"
        )
    return f"no compacted message has id {message_id!r}"


_RECALL_DESCRIPTION = (
    "Fetch the full original of a message that was compacted into a "
    "'[compaction-worker summary]': give its message id or a tool call id. Returns "
    "the message as JSON."
)
_RECALL_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string", "description": "A message id or a tool call id."}},
    "required": ["id"],
    "additionalProperties": False,
}


def recall_tool(handler: Callable[[str | Mapping[str, Any]], Any]) -> RecallTool:
    schema = copy.deepcopy(_RECALL_SCHEMA)  # each tool's own: a caller may change it
    function = {"name": RECALL_TOOL_NAME, "description": _RECALL_DESCRIPTION, "parameters": schema}
    return RecallTool(
        name=RECALL_TOOL_NAME,
        openai={"type": "function", "function": function},
        anthropic={
            "name": RECALL_TOOL_NAME,
            "description": _RECALL_DESCRIPTION,
            "input_schema": schema,
        },
        handler=handler,
    )


# --- the compact_history tool ---------------------------------------------------------------------


COMPACT_TOOL_NAME = "compact_history"

COMPACT_DESCRIPTION = (
    "Compact this conversation's history now: the older messages are replaced by a summary "
    "(their originals stay recallable). Call it when the context is long and its earlier part "
    "is no longer needed word for word: after finishing a sub-task, before starting a new "
    "phase of the work, or after large tool outputs you have already acted on. Do not call it "
    "while you still need the exact text of earlier messages. Optionally pass `instructions`: "
    "what the summary must keep (for example 'keep the failing test names and the error "
    "messages'). It takes effect before a later request, not in the middle of this one."
)

_COMPACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "instructions": {
            "type": "string",
            "maxLength": MAX_INSTRUCTIONS_CHARS,
            "description": "What the summary must keep or focus on (optional).",
        }
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class CompactTool:
    """The ``compact_history`` tool: ``openai`` (a Chat Completions tool), ``anthropic``
    (``{name, description, input_schema}``), ``responses`` (a Responses API function tool),
    and ``handler(arguments) -> str`` (arguments as JSON text or a dict). An async session's
    handler is a coroutine function."""

    name: str
    description: str
    openai: dict[str, Any]
    anthropic: dict[str, Any]
    responses: dict[str, Any]
    handler: Callable[[str | Mapping[str, Any]], Any]


def compact_tool(handler: Callable[[str | Mapping[str, Any]], Any]) -> CompactTool:
    return CompactTool(
        name=COMPACT_TOOL_NAME,
        description=COMPACT_DESCRIPTION,
        openai={
            "type": "function",
            "function": {
                "name": COMPACT_TOOL_NAME,
                "description": COMPACT_DESCRIPTION,
                "parameters": _COMPACT_SCHEMA,
            },
        },
        anthropic={
            "name": COMPACT_TOOL_NAME,
            "description": COMPACT_DESCRIPTION,
            "input_schema": _COMPACT_SCHEMA,
        },
        responses={
            "type": "function",
            "name": COMPACT_TOOL_NAME,
            "description": COMPACT_DESCRIPTION,
            "parameters": _COMPACT_SCHEMA,
        },
        handler=handler,
    )


def instructions_of(arguments: str | Mapping[str, Any]) -> str | None:
    """The ``instructions`` of a call (ValueError when the arguments are not an object whose
    ``instructions``, if any, is a string)."""
    args = json.loads(arguments) if isinstance(arguments, str | bytes) else arguments
    if args is None:
        return None
    if not isinstance(args, Mapping):
        raise ValueError("not an object")
    value = args.get("instructions")
    if value is not None and not isinstance(value, str):
        raise ValueError("instructions is not a string")
    return value


def tool_answer(run: Callable[[str | None], RequestResult], arguments: Any) -> str:
    """The tool result's text for a call: what was asked, or a line starting ``error:``."""
    try:
        instructions = instructions_of(arguments)
    except ValueError:
        return 'error: call with {} or {"instructions": "<what the summary must keep>"}'
    try:
        result = run(instructions)
    except CompactorError as exc:
        return f"error: the compaction cannot be requested: {exc.message}"
    return (
        f"Compaction requested (request {result.request_id}, revision {result.revision}). "
        "The older history is replaced by a summary before a later request; carry on."
    )
