"""What the session reads off a wire message: its own copy, the tool calls it makes or answers."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from worker.wire.models import canonical_json


def own(message: dict[str, Any]) -> dict[str, Any]:
    """A copy the caller cannot change under the session (messages are JSON)."""
    if not isinstance(message, dict):
        raise TypeError(f"a message is a dict, not {type(message).__name__}")
    return copy.deepcopy(message)


def tool_refs(message: dict[str, Any], *, results: bool) -> list[str]:
    """The tool call ids a wire message answers (``results``) or makes (a call)."""
    refs: list[str] = []
    content = message.get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    if results:
        if isinstance(message.get("tool_call_id"), str):  # openai
            refs.append(message["tool_call_id"])
        refs += [str(b.get("tool_use_id")) for b in blocks if b.get("type") == "tool_result"]
    else:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                refs.append(call["id"])
        refs += [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
    return refs


def pinned_key(message: dict[str, Any]) -> str:
    """What a pinned message is known by across compactions: the SHA-256 of what it says
    (its canonical JSON without ``id``); a compaction carries it word for word."""
    said = canonical_json({k: v for k, v in message.items() if k != "id"})
    return hashlib.sha256(said.encode("utf-8", "surrogatepass")).hexdigest()
