"""Recall: the transcripts of applied compactions (a small cache), and the recall tool."""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.client import Client
from worker.wire import formats
from worker.wire.events import CompletedEvent

from ._messages import tool_refs

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


_DESCRIPTION = (
    "Fetch the full original of a message that was compacted into a "
    "'[compaction-worker summary]': give its message id or a tool call id. Returns "
    "the message as JSON."
)
_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string", "description": "A message id or a tool call id."}},
    "required": ["id"],
    "additionalProperties": False,
}


def recall_tool(handler: Callable[[str | Mapping[str, Any]], Any]) -> RecallTool:
    schema = copy.deepcopy(_SCHEMA)  # each tool's own: a caller may change it
    function = {"name": RECALL_TOOL_NAME, "description": _DESCRIPTION, "parameters": schema}
    return RecallTool(
        name=RECALL_TOOL_NAME,
        openai={"type": "function", "function": function},
        anthropic={
            "name": RECALL_TOOL_NAME,
            "description": _DESCRIPTION,
            "input_schema": schema,
        },
        handler=handler,
    )
