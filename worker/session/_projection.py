"""What the session reads off a wire message (its own copy, the tool calls it makes or
answers), and the projected request, cached per history version and extended for appended
messages.

:class:`Projection` is not thread-safe: the session reads and stores it under its lock and
projects outside it.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any

from worker.client import project
from worker.errors import CompactorError
from worker.reuse import Reuse
from worker.wire.models import canonical_json

from ._setup import Setup


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


# --- the projected request ------------------------------------------------------------------------


Request = list[dict[str, Any]]


@dataclass
class Projection:
    setup: Setup
    reuse: Reuse = field(default_factory=lambda: Reuse(conversation_cache_bytes=0))
    projected: tuple[int, Request] | None = None  # (history version, its projection)
    # (the history last projected, its projection): the base of an incremental projection
    base: tuple[list[Any], Request] | None = None

    @property
    def per_result(self) -> bool:
        """Each tool result projects on its own: no keep-recent rule, no budget couples them."""
        config = self.setup.projection_config
        return (
            config.keep_recent_tool_results is None and config.projected_tool_result_budget is None
        )

    def cached(self, version: int) -> Request | None:
        if self.projected is not None and self.projected[0] == version:
            return list(self.projected[1])
        return None

    def store(self, version: int, history: list[Any], request: Request) -> None:
        self.projected = (version, request)
        self.base = (history, request)

    def compute(self, history: list[Any], base: tuple[list[Any], Request] | None) -> Request:
        """The projected request, computed for the new messages only when the history grew by
        appending and every tool result projects on its own (then each result's body depends
        only on itself and its tool's name)."""
        if base is not None and self.per_result:
            raw, projected = base
            same = zip(raw, history[: len(raw)], strict=True)
            if len(raw) <= len(history) and all(a is b for a, b in same):
                start = _slice_start(history, len(raw))
                if start is not None:
                    with contextlib.suppress(CompactorError):  # then the whole, which says why
                        return projected[:start] + self.whole(history[start:])
        return self.whole(history)

    def whole(self, messages: list[dict[str, Any]]) -> Request:
        setup = self.setup
        return project(
            messages,
            format=setup.format,
            config=setup.projection_config,
            model=setup.model,
            system=setup.system,
            compressed=self.reuse.compressed,
        )


def _slice_start(history: list[dict[str, Any]], known: int) -> int | None:
    """Where to start projecting ``history[known:]`` on its own: back to the calls its tool
    results answer (None: some call is not in the history at all)."""
    need: set[str] = set()
    for m in history[known:]:
        need.update(tool_refs(m, results=True))
    for m in history[known:]:
        need.difference_update(tool_refs(m, results=False))
    start = known
    while need:
        if start == 0:
            return None
        start -= 1
        need.update(tool_refs(history[start], results=True))
        need.difference_update(tool_refs(history[start], results=False))
    return start
