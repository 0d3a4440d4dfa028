"""The compacted form of a history an agent sends whole, for the proxy and
``POST /v1/conversations/{id}/compacted``.

An agent that keeps its full history (every proxied request, many HTTP clients) needs every
compaction so far applied to it before it goes to the model. The conversation's composed
compaction (``cw:{conv}:composed``, :mod:`worker.wire.composed`) does that in one step however many
compactions there were; a history that is not the full one (the agent applied some events
itself) falls back to the completed events still in the stream, applied in order where they
match. Either way, what was applied and the conversation's newest outcome are reported, so the
agent can tell a compacted request from one that went out whole, and why.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.api.common import ApiError, aredis_errors, json_body, known_id
from worker.api.state import Api, api_of
from worker.backend import keys
from worker.errors import EventMismatch
from worker.wire.composed import ComposedCompaction, apply_composed
from worker.wire.events import OUTCOME_TYPES, CompletedEvent, parse_event
from worker.wire.history import apply_compaction

# How many of the newest stream entries are read for the conversation's newest outcome: an
# evaluation publishes at most its elided event before its outcome.
_OUTCOME_SCAN = 8
_MAX_HEADER_TEXT = 200


@dataclass(frozen=True)
class Outcome:
    """The conversation's newest outcome event, as headers report it."""

    type: str
    revision: int
    code: str | None = None
    field: str | None = None

    def header(self) -> str:
        """An RFC 8941 dictionary: ``type="compaction.rejected", revision=17, code="...",
        field="..."``."""
        parts = [f"type={_sf_string(self.type)}", f"revision={self.revision}"]
        if self.code:
            parts.append(f"code={_sf_string(self.code)}")
        if self.field:
            parts.append(f"field={_sf_string(self.field)}")
        return ", ".join(parts)


@dataclass(frozen=True)
class CompactedHistory:
    """``messages`` with ``applied`` compactions applied (the newest: ``event_id``);
    ``warning`` says why none was when there are some."""

    messages: list[dict[str, Any]]
    applied: int = 0
    event_id: str | None = None
    outcome: Outcome | None = None
    warning: str | None = None

    def headers(self) -> dict[str, str]:
        out = {"X-Compactor-Compactions": str(self.applied)}
        if self.event_id:
            out["X-Compactor-Compaction-Id"] = self.event_id
        if self.outcome is not None:
            out["X-Compactor-Outcome"] = self.outcome.header()
        if self.warning:
            out["X-Compactor-Warning"] = _ascii(self.warning)
        return out

    def document(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "applied": self.applied,
            "event_id": self.event_id,
            "outcome": None if self.outcome is None else self.outcome.__dict__,
            "warning": self.warning,
        }


async def compacted_history(
    api: Api, internal: str, wire: str, messages: list[dict[str, Any]]
) -> CompactedHistory:
    """``messages`` (of wire format ``wire``) with the conversation's compactions applied: all
    at once when they are the full history, else the stream's completed events that match, in
    order. Raises RedisUnavailable when Redis cannot be read."""
    stored, entries = await _read(api, internal)
    outcome = _newest_outcome(entries)
    composed = _composed(stored)
    if composed is not None and composed.format != wire:
        composed = None
    if composed is not None:
        # Hashing a long history is CPU work: off the event loop, which serves every request.
        with contextlib.suppress(EventMismatch):
            applied = await anyio.to_thread.run_sync(apply_composed, messages, composed)
            return CompactedHistory(applied, composed.compactions, composed.event_id, outcome)
    events = [e for _s, e in reversed(await api.completed_events(internal))]
    out, count, newest = await anyio.to_thread.run_sync(_apply_matching, messages, events, wire)
    warning = None
    if not count and composed is not None:
        warning = (
            f"none of the conversation's {composed.compactions} compactions matches this "
            "history (edited, or of another format): sent uncompacted"
        )
    return CompactedHistory(out, count, newest, outcome, warning)


def _apply_matching(
    messages: list[dict[str, Any]], events: list[CompletedEvent], wire: str
) -> tuple[list[dict[str, Any]], int, str | None]:
    """Each of ``events`` (oldest first) that matches, applied in turn: the history, how many
    applied, and the newest applied."""
    count, newest = 0, None
    for event in events:
        if event.compaction.format != wire:
            continue
        with contextlib.suppress(EventMismatch):
            messages = apply_compaction(messages, event)
            count, newest = count + 1, event.event_id
    return messages, count, newest


async def _read(api: Api, internal: str) -> tuple[bytes | None, list[Any]]:
    with aredis_errors("reading the conversation's compactions"):
        pipe = api.aredis.pipeline(transaction=False)
        pipe.get(keys.composed(internal))
        pipe.xrevrange(keys.events(internal), count=_OUTCOME_SCAN)
        stored, entries = await pipe.execute()
    return stored, entries


def _composed(stored: bytes | None) -> ComposedCompaction | None:
    if not stored:
        return None
    try:
        return ComposedCompaction.model_validate_json(stored)
    except ValueError:
        return None  # written by a newer version in a shape this one cannot read


def _newest_outcome(entries: list[Any]) -> Outcome | None:
    for _entry_id, fields in entries:
        try:
            event = parse_event(fields[b"event"])
        except (ValueError, KeyError):
            continue
        if event.type not in OUTCOME_TYPES:
            continue
        error = getattr(event, "error", None)
        return Outcome(
            type=event.type,
            revision=event.revision,
            code=(
                getattr(error, "code", None)
                or getattr(event, "why", None)
                or getattr(event, "reason", None)
            ),
            field=getattr(error, "field", None),
        )
    return None


def _ascii(text: str) -> str:
    """A header value: printable ASCII, bounded."""
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in text)
    return cleaned[:_MAX_HEADER_TEXT]


def _sf_string(text: str) -> str:
    """An RFC 8941 sf-string: printable ASCII, with backslash and quote escaped."""
    cleaned = _ascii(text).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{cleaned}"'


async def compacted_route(request: Request) -> Response:
    """``POST /v1/conversations/{id}/compacted`` with ``{"format": ..., "messages": [...]}``:
    the history to send to the model, with the conversation's compactions applied."""
    api = api_of(request)
    tenant = api.tenant(request)
    internal = known_id(tenant, request)
    doc = json_body(await api.body(request), api.body_limit)
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        raise ApiError.of(422, "invalid_request", "messages: a list of messages is required")
    if not all(isinstance(m, dict) for m in doc["messages"]):
        raise ApiError.of(422, "invalid_request", "messages: each message is an object")
    wire = doc.get("format", "openai")
    if wire not in ("openai", "anthropic", "responses"):
        raise ApiError.of(422, "invalid_request", "format: one of openai, anthropic, responses")
    result = await compacted_history(api, internal, wire, doc["messages"])
    return JSONResponse(result.document(), headers=result.headers())
