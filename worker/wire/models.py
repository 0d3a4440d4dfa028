"""The models of what comes in: snapshots, and the internal message model they normalize to
(events, what goes out, are in :mod:`worker.wire.events`).

Snapshots carry the agent's messages in their wire format (``openai`` Chat Completions,
``anthropic`` Messages or ``responses``, the OpenAI Responses API's input items). They are
normalized once, by :mod:`worker.wire.formats`, into :class:`Message` objects that the pure core
works on; the raw messages are kept as they came, because the transcript stores them and the
agent applies events to them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictInt, model_validator

from worker.wire.media import Attachment

Role = Literal["system", "user", "assistant", "tool"]
WireFormat = Literal["openai", "anthropic", "responses"]
# 2**53 - 1: exact in JSON numbers everywhere and in Redis' Lua (doubles). Transcript names
# carry it zero-padded to 18 digits, so they sort by revision.
MAX_REVISION = 2**53 - 1
# Not starting with "." or "-": ids become directory names and command-line arguments.
CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9_:][A-Za-z0-9._:\-]{0,127}$"
CONVERSATION_ID_RULE = (
    "must be 1-128 characters of A-Z a-z 0-9 . _ : - and not start with '.' or '-'"
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(_Frozen):
    id: str
    name: str
    arguments: str = ""


class Message(_Frozen):
    """One normalized message. ``source_index`` is its position in the snapshot's ``messages``
    (an Anthropic message may yield several of these; -1 is Anthropic's top-level system).
    ``joins_next``: the message belongs with the one after it and is never separated from it
    (a Responses ``reasoning`` item and the call or message it produced). ``attachments``: its
    images, files and opaque payloads, with what each costs (:mod:`worker.wire.media`); their
    bytes stay in the wire message.

    Provider-native compaction (docs/native-compaction.md): ``native_compaction`` marks a message
    that holds the provider's own compaction of everything before it (an Anthropic ``compaction``
    block with content, a Responses ``compaction`` item). The provider reads nothing before the
    newest one, so every message before it is ``superseded``: not counted, never compacted or
    summarized again (the transcript still keeps it). ``unknown_types``: the block or item types
    of this wire message that the format does not know, carried as they came, never read into
    the text, counted by an estimate (an ``opaque`` attachment each).

    ``pinned``: carried word for word through every compaction (the snapshot's ``pinned``
    names its wire message), never summarized (docs/snapshot.md, "Pins")."""

    id: str
    role: Role
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    source_index: int
    joins_next: bool = False
    attachments: tuple[Attachment, ...] = ()
    native_compaction: bool = False
    superseded: bool = False
    unknown_types: tuple[str, ...] = ()
    pinned: bool = False

    @property
    def attachment_tokens(self) -> int:
        return sum(a.tokens for a in self.attachments)


class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=256)
    context_window: StrictInt | None = Field(default=None, ge=1)


class Usage(BaseModel):
    """The provider-reported usage of the agent's last request, which held the first
    ``message_count`` messages of this snapshot (docs/snapshot.md, "Usage"): all its input
    tokens, of which ``cached_input_tokens`` were read from the provider's prompt cache and
    ``cache_creation_input_tokens`` written to it; ``requested_at``: when it was sent."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: StrictInt = Field(ge=0, le=MAX_REVISION)
    message_count: StrictInt = Field(ge=1, le=MAX_REVISION)
    cached_input_tokens: StrictInt | None = Field(default=None, ge=0, le=MAX_REVISION)
    cache_creation_input_tokens: StrictInt | None = Field(default=None, ge=0, le=MAX_REVISION)
    requested_at: AwareDatetime | None = None

    @model_validator(mode="after")
    def _cache_within_input(self) -> Usage:
        cached = (self.cached_input_tokens or 0) + (self.cache_creation_input_tokens or 0)
        if cached > self.input_tokens:
            raise ValueError(
                "cached_input_tokens + cache_creation_input_tokens exceed input_tokens "
                "(input_tokens counts every input token of the request, cached ones included)"
            )
        return self


class Snapshot(BaseModel):
    """A snapshot as submitted (docs/snapshot.md). ``messages`` stay in the agent's wire format."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(pattern=CONVERSATION_ID_PATTERN)
    revision: StrictInt = Field(ge=0, le=MAX_REVISION)
    model: ModelInfo = Field(default_factory=ModelInfo)
    format: WireFormat = "openai"
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None  # Anthropic's top-level system prompt
    config: dict[str, Any] = Field(default_factory=dict)
    tools: dict[str, Any] = Field(default_factory=dict)
    usage: Usage | None = None
    # Ids of messages carried word for word through every compaction (docs/snapshot.md, "Pins").
    pinned: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=10_000
    )


def canonical_json(value: Any, *, finite: bool = False) -> str:
    """Deterministic JSON for hashing (sorted keys, no spaces, unicode kept). ``finite``: NaN
    and the infinities raise ValueError, as ``json.dumps(allow_nan=False)`` does (the text of
    everything else is the same)."""
    encoder = _finite_canonical_encoder if finite else _canonical_encoder
    if encoder is None:  # a Python without json's C accelerator
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=not finite
        )
    return "".join(encoder(value, 0))


def canonical_array(items: Sequence[str]) -> str:
    """The canonical JSON of a list whose items are already canonical JSON texts: what
    :func:`canonical_json` gives for the list itself (it separates items by "," alone)."""
    return "[" + ",".join(items) + "]"


def canonical_object(fields: Mapping[str, str]) -> str:
    """The canonical JSON of an object whose values are already canonical JSON texts: what
    :func:`canonical_json` gives for the object itself (keys sorted, ":" and "," alone)."""
    return "{" + ",".join(f"{canonical_json(key)}:{fields[key]}" for key in sorted(fields)) + "}"


def _make_canonical_encoder(*, allow_nan: bool) -> Callable[[Any, int], Iterable[str]] | None:
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
        None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, allow_nan
    )


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_canonical_encoder = _make_canonical_encoder(allow_nan=True)
_finite_canonical_encoder = _make_canonical_encoder(allow_nan=False)


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
