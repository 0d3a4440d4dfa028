"""An events summarizer for Google's Agent Development Kit (ADK) whose summaries are ours.

ADK compacts a session's events itself: with ``App(events_compaction_config=
EventsCompactionConfig(...))`` it picks a range of events (after an invocation, or before a
model call under ``token_threshold``) and asks the config's ``summarizer`` for one compaction
event. :class:`CompactingEventsSummarizer` is such a summarizer: the range becomes a snapshot,
the service compacts it (a requested compaction: ADK has decided when) and the answer is ADK's
own compaction event, ``EventActions(compaction=EventCompaction(start_timestamp,
end_timestamp, compacted_content))``, for the events the service replaced; ``None``, what ADK
takes for "no compaction", when the service skipped, failed or did not answer in time.

The replacement is the service's: the user turns it carries verbatim (ADK's own parts, byte
for byte) and then its summary, one ``user`` content as in the service's replacement. ADK
drops the events between the timestamps and sends that content in their place; the protected
tail (the range's newest exchange) stays as raw events, and so does everything from the first
carried message that is not a user turn (a call a per-tool hint keeps, a delegation result),
which ADK's single content cannot hold in order.

Events are given to the service as Chat Completions messages (``format="openai"``, each with
the event's id): text as text, ``thought`` text as ``reasoning_content``, a model's function
calls as ``tool_calls`` (arguments as JSON text), each function response whose call precedes
it as a ``tool`` message (the response as JSON), inline images and files as ``image_url`` and
``file`` parts; a text part starting with the summary marker (an earlier summary, which ADK
hands back at the start of the next range) as a user message of its own, so the service folds
it into the new summary. A function response whose call is not among the events is an
assistant message with its JSON; any other part is counted as its JSON without its opaque
fields. Each message carries the event it came from under :data:`EXTRA_KEY`: the event's
other fields (on its first message) and the parts the message stands for, thought signatures
and file URIs included; inline bytes are not repeated there, they are in the message's media
part. So :func:`from_wire` gives back the events exactly (from a transcript, say), and nothing
opaque reaches a message's text.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from google.adk.apps.base_events_summarizer import BaseEventsSummarizer
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions, EventCompaction
from google.genai import types

from worker.client import Client
from worker.config import Settings, load_settings
from worker.errors import InvalidRequest, InvalidSnapshot
from worker.pipeline import Adapters, Pipeline
from worker.summarize.factory import ClosableSummarizer, llm_summarizer
from worker.transcripts import TranscriptStore, open_store
from worker.wire.events import (
    SUMMARY_MARKER,
    Compaction,
    CompactionEvent,
    CompletedEvent,
    rejected_event,
)
from worker.wire.formats.common import readable
from worker.wire.models import CONVERSATION_ID_PATTERN, CONVERSATION_ID_RULE, canonical_json
from worker.wire.requests import CompactRequest, compact_request, new_request_id

__all__ = ["EXTRA_KEY", "CompactingEventsSummarizer", "from_wire", "to_wire"]

log = logging.getLogger(__name__)

EXTRA_KEY = "x_adk"  # the event a wire message came from, and the parts it stands for
# ADK decides when to compact: the service's own trigger stays off for these snapshots, so
# that what it publishes for one is the outcome of ADK's request alone.
_TRIGGER_OFF = {"auto_compact_trigger": "off"}
_DIGEST_HEX = 32  # of the range's event ids, after the prefix: the conversation id


class CompactingEventsSummarizer(BaseEventsSummarizer):
    """ADK's ``EventsCompactionConfig.summarizer``, answered by the compaction service.

    Without ``client``, it makes a :class:`worker.client.Client` from the configuration and
    ``COMPACTOR_REDIS_URL`` (a running service: ``compactor up``, or Redis and workers of your
    own); ``in_process=True`` uses none: the compaction is made in this process by the
    pipeline ``compactor compact`` runs (``settings``' mode, LLM and transcript store).

    Each range ADK asks about is a conversation of its own, ``conversation_prefix`` and 32 hex
    digits of the SHA-256 of its event ids (ADK gives a summarizer the events, not their
    session), revision 1. ``model`` and ``context_window`` are the snapshot's; ``config`` and
    ``tools`` its overrides (docs/snapshot.md); ``instructions`` what every summary should
    keep (as ``Client.compact_now``'s). ``timeout_s``: how long to wait for the service's
    outcome. :attr:`outcomes` holds the newest ``keep_outcomes`` outcome events, newest last.
    Call :meth:`close` when done."""

    def __init__(
        self,
        *,
        client: Client | None = None,
        in_process: bool = False,
        settings: Settings | None = None,
        conversation_prefix: str = "adk-",
        model: str | None = None,
        context_window: int | None = None,
        config: Mapping[str, Any] | None = None,
        tools: Mapping[str, Any] | None = None,
        instructions: str | None = None,
        timeout_s: float = 120.0,
        keep_outcomes: int = 100,
    ) -> None:
        super().__init__()
        if client is not None and (in_process or settings is not None):
            raise TypeError("a client brings its own settings and runs nothing in process")
        if not re.fullmatch(CONVERSATION_ID_PATTERN, conversation_prefix + "0" * _DIGEST_HEX):
            raise InvalidRequest("conversation_prefix", CONVERSATION_ID_RULE)
        self.settings = client.settings if client is not None else settings or load_settings()
        # Checked now, as a request would be: a bad override names its field here, not later.
        self._instructions = compact_request(
            self.settings, instructions=instructions, config=config, tools=tools
        ).instructions
        self._owns_client = client is None and not in_process
        self.client = None if in_process else client or Client(self.settings)
        self.conversation_prefix = conversation_prefix
        self._model = {"name": model or "", "context_window": context_window}
        self._config = {**(config or {}), **_TRIGGER_OFF}
        self._tools = dict(tools or {})
        self.timeout_s = timeout_s
        self.outcomes: deque[CompactionEvent] = deque(maxlen=keep_outcomes)
        self._local = _LocalPipeline(self.settings) if in_process else None

    async def maybe_summarize_events(self, *, events: list[Event]) -> Event | None:
        """ADK's compaction event for what the service replaced of ``events``, or None."""
        wire = to_wire(events)
        if not wire:
            return None
        snapshot = self._snapshot(events, wire)
        # The service's round trip (or the in-process pipeline) blocks: off the event loop.
        outcome = await asyncio.to_thread(self._compact, snapshot)
        if outcome is None:
            return None
        self.outcomes.append(outcome)
        if not isinstance(outcome, CompletedEvent):
            _log_no_compaction(outcome, len(events))
            return None
        answer = _compaction_event(events, wire, outcome.compaction)
        if answer is None:
            log.info(
                "%s: the service replaced nothing ADK can drop from %d events",
                outcome.conversation_id,
                len(events),
            )
        return answer

    def _snapshot(self, events: Sequence[Event], wire: list[dict[str, Any]]) -> dict[str, Any]:
        ids = "\n".join(e.id for e in events).encode("utf-8")
        digest = hashlib.sha256(ids).hexdigest()[:_DIGEST_HEX]
        return {
            "conversation_id": self.conversation_prefix + digest,
            "revision": 1,
            "format": "openai",
            "model": self._model,
            "messages": wire,
            "config": self._config,
            "tools": self._tools,
        }

    def _compact(self, snapshot: dict[str, Any]) -> CompactionEvent | None:
        if self._local is not None:
            return self._local.compact(snapshot, self._instructions)
        assert self.client is not None
        conversation_id = snapshot["conversation_id"]
        self.client.submit(snapshot)
        asked = self.client.compact_now(conversation_id, self._instructions)
        try:
            return self.client.wait_for(
                conversation_id, request_id=asked.request_id, timeout_s=self.timeout_s
            )
        except TimeoutError:
            log.warning(
                "%s: no outcome within %g s; ADK goes on uncompacted",
                conversation_id,
                self.timeout_s,
            )
            return None

    def close(self) -> None:
        """Close what this summarizer opened (its client, or its store and LLM client)."""
        if self._local is not None:
            self._local.close()
        if self._owns_client and self.client is not None:
            self.client.close()


class _LocalPipeline:
    """The pipeline of ``compactor compact``, kept for the summarizer's life."""

    def __init__(self, settings: Settings) -> None:
        self.store: TranscriptStore = open_store(settings)
        self.llm: ClosableSummarizer | None = llm_summarizer(settings)
        self.pipeline = Pipeline(settings, Adapters(store=self.store, llm=self.llm))

    def compact(self, snapshot: dict[str, Any], instructions: str | None) -> CompactionEvent | None:
        request = CompactRequest(request_id=new_request_id(), instructions=instructions)
        try:
            parsed = self.pipeline.parse(snapshot)
        except InvalidSnapshot as exc:  # as the worker answers it: a rejection naming the field
            return rejected_event(
                snapshot["conversation_id"],
                snapshot["revision"],
                datetime.now(UTC),
                code=exc.code,
                field=exc.field,
                reason=exc.reason,
                message=exc.message,
            )
        return self.pipeline.compact_requested(parsed, request)

    def close(self) -> None:
        self.store.close()
        if self.llm is not None:
            self.llm.close()


def _log_no_compaction(outcome: CompactionEvent, count: int) -> None:
    reason = getattr(outcome, "reason", None)
    level = logging.INFO if outcome.type == "compaction.skipped" else logging.WARNING
    log.log(level, "%s: %s of %d events: %s", outcome.conversation_id, outcome.type, count, reason)


# --- the service's compaction as ADK's ----------------------------------------------------------


def _compaction_event(
    events: Sequence[Event], wire: Sequence[dict[str, Any]], compaction: Compaction
) -> Event | None:
    """ADK's compaction event for ``compaction`` of ``to_wire(events)``: the whole events it
    replaced, up to the first carried message that is not a user turn, as one ``user`` content
    (the carried user turns, then the summary); None when that is no event, or only an earlier
    summary."""
    at = _event_indices(events, wire)
    position = {m["id"]: k for k, m in enumerate(wire)}
    cut = _cut(compaction, position)
    span = _span(events, at, compaction.start, cut)
    if span is None:
        return None
    first, last = span
    covered = [m for k, m in enumerate(wire) if first <= at[k] <= last]
    if all(_is_summary(m) for m in covered):
        return None  # ADK already holds that summary: nothing new to drop
    carried = [
        # A turn the service wrote anew (shortened) comes without our key: the original's parts
        # (its images' bytes among them) are found by its id.
        {EXTRA_KEY: wire[position[m["id"]]][EXTRA_KEY], **m}
        for m in compaction.replacement
        if m.get("id") in position
        and _user_turn(m)
        and position[m["id"]] < cut
        and first <= at[position[m["id"]]] <= last
    ]
    parts = [p for e in from_wire(carried) for p in (e.content.parts if e.content else None) or ()]
    parts.append(types.Part(text=compaction.summary.text))
    return Event(
        author="user",  # as ADK's own LlmEventSummarizer
        invocation_id=Event.new_id(),
        actions=EventActions(
            compaction=EventCompaction(
                start_timestamp=events[first].timestamp,
                end_timestamp=events[last].timestamp,
                compacted_content=types.Content(role="user", parts=parts),
            )
        ),
    )


def _event_indices(events: Sequence[Event], wire: Sequence[dict[str, Any]]) -> list[int]:
    """The index in ``events`` of the event each wire message came from."""
    index = {e.id: i for i, e in enumerate(events)}
    return [index[m[EXTRA_KEY]["event"]] for m in wire]


def _cut(compaction: Compaction, position: dict[str, int]) -> int:
    """Where what ADK may drop ends: the range's end, or the first carried message that is not
    a user turn (ADK's one content cannot hold it in its place)."""
    for m in compaction.replacement:
        k = position.get(m.get("id", ""))
        if k is not None and not _user_turn(m):
            return min(k, compaction.end)
    return compaction.end


def _span(events: Sequence[Event], at: list[int], start: int, cut: int) -> tuple[int, int] | None:
    """The first and last event wholly inside wire messages ``start..cut``, shrunk until no
    event outside shares a timestamp with one inside (ADK drops events by their timestamps)."""
    if cut <= start:
        return None
    first, last = at[start], at[cut - 1]
    if start > 0 and at[start - 1] == first:
        first += 1
    if cut < len(at) and at[cut] == last:
        last -= 1
    while first <= last and first > 0 and events[first - 1].timestamp >= events[first].timestamp:
        first += 1
    while (
        first <= last
        and last + 1 < len(events)
        and events[last].timestamp >= events[last + 1].timestamp
    ):
        last -= 1
    return (first, last) if first <= last else None


def _user_turn(m: dict[str, Any]) -> bool:
    return m.get("role") == "user" and not _is_summary(m)


def _is_summary(m: dict[str, Any]) -> bool:
    content = m.get("content")
    return (
        m.get("role") == "user" and isinstance(content, str) and content.startswith(SUMMARY_MARKER)
    )


# --- ADK events <-> Chat Completions messages ---------------------------------------------------


def to_wire(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Chat Completions messages for ADK events (see the module's docstring); an event without
    content has none."""
    out: list[dict[str, Any]] = []
    calls: set[str] = set()  # the function calls so far, which a response may answer
    for event in events:
        if event.content is None:
            continue
        for k, (role, parts) in enumerate(_split(event.content, calls)):
            message, media = _render(role, parts)
            extra: dict[str, Any] = {"event": event.id, "parts": _stored(parts, media)}
            if media:
                extra["media"] = media
            if k == 0:
                extra["meta"] = _meta(event)
                extra["role"] = event.content.role
            out.append(
                {"id": event.id if k == 0 else f"{event.id}#{k}", **message, EXTRA_KEY: extra}
            )
    return out


def _split(content: types.Content, calls: set[str]) -> list[tuple[str, list[types.Part]]]:
    """A content's parts as (role, parts) messages, in order: each function response and each
    earlier summary a message of its own, the rest in runs of the content's role. ``calls``
    gains the calls made here."""
    role = "assistant" if content.role == "model" else "user"
    out: list[tuple[str, list[types.Part]]] = []
    run: list[types.Part] = []
    for part in content.parts or ():
        response = part.function_response
        alone = None
        if response is not None:
            # Answering a call before it: a tool message. Else (its call was compacted away, or
            # it has no id) what the tool returned, read like the model's text: never a user turn.
            alone = "tool" if response.id in calls else "assistant"
        elif part.text is not None and not part.thought and part.text.startswith(SUMMARY_MARKER):
            alone = "user"
        if alone is None:
            run.append(part)
            call = part.function_call
            if call is not None and call.id and role == "assistant":
                calls.add(call.id)
            continue
        if run:
            out.append((role, run))
            run = []
        out.append((alone, [part]))
    if run or not out:
        out.append((role, run))
    return out


def _render(role: str, parts: Sequence[types.Part]) -> tuple[dict[str, Any], list[int]]:
    """One wire message of ``parts``, and which of them are its media parts, in order."""
    if role == "tool":
        response = parts[0].function_response
        assert response is not None and response.id
        return {
            "role": "tool",
            "tool_call_id": response.id,
            "content": _json(response.response or {}),
        }, []
    items: list[dict[str, Any]] = []
    reasoning: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    media: list[int] = []
    for k, part in enumerate(parts):
        call = part.function_call
        if part.text is not None and part.thought:
            reasoning.append(part.text)
        elif part.text is not None:
            items.append({"type": "text", "text": part.text})
        elif call is not None and call.id and call.name and role == "assistant":
            tool_calls.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _json(call.args or {})},
                }
            )
        elif (item := _media_item(part)) is not None:
            media.append(k)
            items.append(item)
        elif text := _other_text(part):
            items.append({"type": "text", "text": text})
    message: dict[str, Any] = {"role": role, "content": _content(items, bool(tool_calls))}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message, media


def _content(items: list[dict[str, Any]], calls: bool) -> str | list[dict[str, Any]] | None:
    if not items:
        return None if calls else ""
    if len(items) == 1 and items[0]["type"] == "text":
        return str(items[0]["text"])
    return items


def _media_item(part: types.Part) -> dict[str, Any] | None:
    """An inline image as an ``image_url`` part, other inline data or a file reference as a
    ``file`` part (named by its display name only: a file URI is the provider's object id)."""
    blob, ref = part.inline_data, part.file_data
    if blob is not None and blob.data is not None:
        mime = blob.mime_type or "application/octet-stream"
        url = f"data:{mime};base64,{base64.b64encode(blob.data).decode('ascii')}"
        if mime.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": url}}
        return {"type": "file", "file": {"file_data": url, "filename": blob.display_name or "file"}}
    if ref is not None:
        return {"type": "file", "file": {"filename": ref.display_name or "file"}}
    return None


def _other_text(part: types.Part) -> str:
    """A part the message has no field for, as JSON: a function call or response it cannot
    hold as one (no id, or no call before it), or what of any other part (code, its result, a
    server-side tool's call, ...) may be read: no signature, inline data, file URI or id."""
    if (response := part.function_response) is not None:
        return _json({"function_response": {"name": response.name, "response": response.response}})
    if (call := part.function_call) is not None:
        return _json({"function_call": {"name": call.name, "args": call.args}})
    raw = part.model_dump(mode="json", exclude_none=True, exclude={"thought_signature"})
    kept = readable(raw)
    return canonical_json(kept) if kept else ""


def _stored(parts: Sequence[types.Part], media: list[int]) -> list[dict[str, Any]]:
    """The parts as JSON, inline bytes left out where the message's media part holds them."""
    out = []
    for k, part in enumerate(parts):
        raw = part.model_dump(mode="json", exclude_none=True)
        if k in media and "inline_data" in raw:
            raw["inline_data"] = {key: v for key, v in raw["inline_data"].items() if key != "data"}
        out.append(raw)
    return out


def _meta(event: Event) -> dict[str, Any]:
    """The event without its content, as JSON (a value that is not JSON as its text)."""
    dumped: dict[str, Any] = json.loads(
        event.model_dump_json(exclude_none=True, exclude={"content"}, fallback=str)
    )
    return dumped


def from_wire(messages: Iterable[dict[str, Any]]) -> list[Event]:
    """ADK events for wire messages: the events :func:`to_wire` made them of, as they were
    (consecutive messages of one event joined again), a message the service changed with its
    new text, and a new event for a message the service wrote (a summary)."""
    out: list[Event] = []
    for m in messages:
        extra = m.get(EXTRA_KEY)
        if not isinstance(extra, dict):
            out.append(_new_event(m))
            continue
        parts = _parts_of(m, extra)
        if "meta" not in extra and out and out[-1].id == extra["event"] and out[-1].content:
            out[-1].content.parts = [*(out[-1].content.parts or ()), *parts]
            continue
        meta = extra.get("meta") or {"id": extra["event"]}
        role = extra.get("role") or ("model" if m.get("role") == "assistant" else "user")
        out.append(Event.model_validate({**meta, "content": {"role": role, "parts": parts}}))
    return out


def _parts_of(m: dict[str, Any], extra: dict[str, Any]) -> list[types.Part]:
    """A message's own parts, inline bytes back from its media parts; rebuilt from the message
    when the service changed it (a shortened turn, a stripped call or result)."""
    stored = [dict(p) for p in extra.get("parts") or ()]
    content = m.get("content")
    items = content if isinstance(content, list) else []
    media = [i for i in items if isinstance(i, dict) and i.get("type") in ("image_url", "file")]
    for k, item in zip(extra.get("media") or (), media, strict=False):
        data = _data_of(_item_url(item))
        if data is not None and "inline_data" in stored[k]:
            stored[k] = {**stored[k], "inline_data": {**stored[k]["inline_data"], "data": data}}
    parts = [types.Part.model_validate(p) for p in stored]
    fresh, _media = _render(str(m.get("role")), parts)
    if all(
        fresh.get(key) == m.get(key) for key in ("role", "content", "tool_calls", "tool_call_id")
    ):
        return parts
    return _rebuilt(m, parts)


def _rebuilt(m: dict[str, Any], parts: list[types.Part]) -> list[types.Part]:
    if m.get("role") == "tool":
        response = parts[0].function_response if parts else None
        return [
            types.Part(
                function_response=types.FunctionResponse(
                    id=m.get("tool_call_id"),
                    name=response.name if response is not None else None,
                    response={"result": _text_of(m.get("content"))},
                )
            )
        ]
    signatures = {
        p.function_call.id: p.thought_signature for p in parts if p.function_call is not None
    }
    out = [types.Part(text=t) for t in [_text_of(m.get("content"))] if t]
    out += [p for p in parts if _media_item(p) is not None]
    for call in m.get("tool_calls") or ():
        fn = call.get("function") or {}
        out.append(
            types.Part(
                function_call=types.FunctionCall(
                    id=call.get("id"), name=fn.get("name"), args=_args(fn.get("arguments"))
                ),
                thought_signature=signatures.get(call.get("id")),
            )
        )
    return out


def _new_event(m: dict[str, Any]) -> Event:
    """An event for a message the service wrote (a summary) or one not made by to_wire."""
    role = "model" if m.get("role") == "assistant" else "user"
    text = _text_of(m.get("content"))
    return Event(
        author="user" if role == "user" else "model",
        content=types.Content(role=role, parts=[types.Part(text=text)]),
    )


def _item_url(item: dict[str, Any]) -> str | None:
    spec = item.get("image_url") or item.get("file")
    url = spec.get("url") or spec.get("file_data") if isinstance(spec, dict) else None
    return url if isinstance(url, str) else None


def _data_of(url: str | None) -> bytes | None:
    """The bytes of a base64 data URL; None for anything else."""
    head, comma, payload = (url or "").partition(",")
    if not (comma and head.startswith("data:") and head.endswith(";base64")):
        return None
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error:
        return None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = [
        i.get("text") for i in content or () if isinstance(i, dict) and i.get("type") == "text"
    ]
    return "\n".join(t for t in texts if isinstance(t, str))


def _args(arguments: Any) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
