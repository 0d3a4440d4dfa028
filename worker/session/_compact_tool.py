"""The agent-invokable ``compact_history`` tool (``session.compact_tool()``): the model asks for
a compaction of its own conversation, optionally saying what the summary must keep.

The same tool in the three shapes the providers take: Chat Completions (``openai``), the
Messages API (``anthropic``) and the Responses API / OpenAI Agents SDK (``responses``); its
``handler`` takes the call's arguments (JSON text or a dict) and answers text for the tool
result. Calling it asks the service (``Client.compact_now``); the compaction arrives like any
other and is applied before a later request, never in the middle of the current one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.client import RequestResult
from worker.errors import CompactorError
from worker.wire.requests import MAX_INSTRUCTIONS_CHARS

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

_SCHEMA: dict[str, Any] = {
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
                "parameters": _SCHEMA,
            },
        },
        anthropic={
            "name": COMPACT_TOOL_NAME,
            "description": COMPACT_DESCRIPTION,
            "input_schema": _SCHEMA,
        },
        responses={
            "type": "function",
            "name": COMPACT_TOOL_NAME,
            "description": COMPACT_DESCRIPTION,
            "parameters": _SCHEMA,
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
