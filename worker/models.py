"""Every model that crosses a boundary: snapshots in, events out, and the internal message model.

Snapshots carry the agent's messages in their wire format (``openai`` Chat Completions or
``anthropic`` Messages). They are normalized once, by :mod:`worker.formats`, into
:class:`Message` objects that the pure core works on; the raw messages are kept as they came,
because the transcript stores them and the agent applies events to them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

Role = Literal["system", "user", "assistant", "tool"]
WireFormat = Literal["openai", "anthropic"]
EventType = Literal[
    "compaction.completed",
    "compaction.skipped",
    "compaction.failed",
    "compaction.rejected",
    "tool_results.elided",
]
# 2**53 - 1: exact in JSON numbers everywhere and in Redis' Lua (doubles). Transcript names
# carry it zero-padded to 18 digits, so they sort by revision.
MAX_REVISION = 2**53 - 1
CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9_:\-][A-Za-z0-9._:\-]{0,127}$"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(_Frozen):
    id: str
    name: str
    arguments: str = ""


class Message(_Frozen):
    """One normalized message. ``source_index`` is its position in the snapshot's ``messages``
    (an Anthropic message may yield several of these; -1 is Anthropic's top-level system)."""

    id: str
    role: Role
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    source_index: int


class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=256)
    context_window: StrictInt | None = Field(default=None, ge=1)


class Snapshot(BaseModel):
    """A snapshot as submitted (DESIGN.md §3). ``messages`` stay in the agent's wire format."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(pattern=CONVERSATION_ID_PATTERN)
    revision: StrictInt = Field(ge=0, le=MAX_REVISION)
    model: ModelInfo = Field(default_factory=ModelInfo)
    format: WireFormat = "openai"
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None  # Anthropic's top-level system prompt
    config: dict[str, Any] = Field(default_factory=dict)
    tools: dict[str, Any] = Field(default_factory=dict)


class ToolCallPolicy(_Frozen):
    """How a compaction treats one tool's calls (RFD D17): strip parts of them, or omit them."""

    policy: Literal["strip", "omit"] = "strip"
    request: bool = False
    response: bool = False


class Trigger(_Frozen):
    kind: str
    threshold_tokens: int | None = None
    projected_tokens: int
    context_window: int | None = None


class Summary(_Frozen):
    text: str
    tokens: int
    source: Literal["llm", "digest"]
    truncated: bool = False
    fallback_reason: str | None = None
    chunks: int = 1


class TranscriptRef(_Frozen):
    uri: str
    sha256: str
    bytes: int


class Compaction(_Frozen):
    start: int
    end: int
    first_id: str
    last_id: str
    replacement: list[dict[str, Any]]
    summary: Summary
    tool_calls: ToolCallPolicy | None = None
    tool_overrides: dict[str, ToolCallPolicy] = Field(default_factory=dict)
    tokens_before: int
    tokens_after: int
    transcript: TranscriptRef | None = None
    format: WireFormat = "openai"
    preserved_ids: list[str] = Field(default_factory=list)


class ElidedResult(_Frozen):
    call_id: str
    tool: str
    action: Literal["marker", "ellipsis", "emptied", "preview"]
    bytes_before: int
    bytes_after: int


class EventError(_Frozen):
    code: str
    message: str
    field: str | None = None


class CompactionEvent(_Frozen):
    type: EventType
    event_id: str
    conversation_id: str
    revision: int
    created_at: datetime
    trigger: Trigger | None = None
    compaction: Compaction | None = None
    elided: list[ElidedResult] | None = None
    reason: str | None = None
    error: EventError | None = None

    def to_json(self) -> str:
        """The event as published: every field present, nulls included (DESIGN.md §3)."""
        return self.model_dump_json()


def canonical_json(value: Any) -> str:
    """Deterministic JSON for hashing (sorted keys, no spaces, unicode kept)."""
    if _canonical_encoder is None:  # a Python without json's C accelerator
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "".join(_canonical_encoder(value, 0))


def _make_canonical_encoder() -> Callable[[Any, int], Iterable[str]] | None:
    """json's C encoder with json.dumps' canonical settings, made once: every message of a
    snapshot without its own id is hashed through it, and json.dumps would rebuild an encoder
    for each call (half the cost of a message's id). The output is byte for byte json.dumps'."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    # (markers, default, encoder, indent, key_sep, item_sep, sort_keys, skipkeys, allow_nan).
    # No markers: a shared markers dict is not thread-safe, and a cycle (only possible in a
    # Mapping a caller built) still ends, in RecursionError. The default raises TypeError for
    # what JSON cannot hold, as json.dumps does.
    return make(  # type: ignore[no-any-return]
        None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, True
    )


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_canonical_encoder = _make_canonical_encoder()


def derived_message_id(index: int, raw: Any) -> str:
    """A stable id for a message that came without one: its position and content."""
    digest = hashlib.sha256(canonical_json(raw).encode("utf-8", "surrogatepass")).hexdigest()
    return f"m{index}-{digest[:12]}"


def is_plain_json(value: Any) -> bool:
    """Whether a JSON value holds only strings and nulls (in any lists and objects): then two
    values that are ``==`` have the same JSON text. (A loop, not recursion: no depth limit.)"""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is str or item is None:
            continue
        if kind is dict:
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
        else:
            return False
    return True


def event_id_for(conversation_id: str, revision: int, kind: str, *parts: object) -> str:
    """Deterministic, so a redelivered task re-creates the same event, not a second one."""
    key = canonical_json([conversation_id, revision, kind, *map(str, parts)])
    return hashlib.sha256(key.encode()).hexdigest()[:32]
