"""OpenAI's compact endpoint, served by the service: ``POST /v1/responses/compact``, and
``POST /proxy/openai/v1/responses/compact`` for an agent whose OpenAI base URL is the proxy.

A client that honours a custom base URL (the ``openai`` SDK's ``client.responses.compact``, the
Agents SDK's ``OpenAIResponsesCompactionSession``) compacts through the service in place of
OpenAI's native compaction. The body is OpenAI's (``model``, ``input``: a string or Responses
items, ``instructions``, ``previous_response_id``); the answer is OpenAI's
``response.compaction`` object, whose ``output`` is the window to send back as the next input.

The compaction is the workers', made as every compaction is (redaction, fidelity check, the
digest or the LLM, the transcript kept, the event published): the window is submitted as the
conversation's next snapshot (format ``responses``; its auto trigger off, so the compaction
asked for is the only one made), a compaction of it is requested (``Client.compact_now``), and
the answer waits for that request's outcome event. ``output`` is the window with the
conversation's compactions applied (:func:`worker.api.compacted_history.compacted_history`):
the kept head, the carried user turns, one readable summary message, the kept tail. No
encrypted item is ever made up; the client's own opaque items and fields are carried as they
came.

The conversation is the one ``X-Compactor-Conversation`` names, else one derived from the
window's opening items (:func:`derived_conversation`), so that a session's successive compacts,
each sending the previous output plus its new turns, land in one conversation. The service
keeps no responses: ``previous_response_id`` is refused unless a conversation is named, whose
newest snapshot then stands for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.api.auth import Tenant, bearer
from worker.api.common import ApiError, aredis_errors, json_body
from worker.api.compacted_history import Outcome, compacted_history
from worker.api.proxy import CONVERSATION_HEADER, KEY_HEADER
from worker.api.state import Api
from worker.backend import keys
from worker.backend.streams import anewest_id, stream_entries
from worker.errors import CompactorError, InvalidRequest, InvalidSnapshot, NoSnapshot
from worker.wire.events import (
    OUTCOME_TYPES,
    SUMMARY_MARKER,
    CompactionEvent,
    CompletedEvent,
    FailedEvent,
    ProposedEvent,
    RejectedEvent,
    SkippedEvent,
    parse_event,
)
from worker.wire.models import canonical_json
from worker.wire.snapshots import decode_json

log = logging.getLogger(__name__)

V1_PATH = "/v1/responses/compact"
PROXY_PATH = "/proxy/openai/v1/responses/compact"
# The proxy's headers, as errors name them (HTTP header names are read in any case).
CONVERSATION_NAME = "X-Compactor-Conversation"
KEY_NAME = "X-Compactor-Key"
MAX_MODEL_CHARS = 256  # a snapshot's model.name
DERIVED_PREFIX = "responses-"

# What the body may hold. Read: these. Accepted and ignored: the rest of OpenAI's compact
# parameters (nothing here uses a prompt cache, an image policy or a service tier) and the
# request settings a client such as Codex sends along with its window.
READ_FIELDS = ("model", "input", "instructions", "previous_response_id")
IGNORED_FIELDS = frozenset(
    {
        "image",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "safety_identifier",
        "service_tier",
        "tools",
        "parallel_tool_calls",
        "reasoning",
        "text",
    }
)

# The next revision of a conversation: the proxy's counter (so proxied turns and compacts of
# one conversation never reuse a revision), moved past the newest one submitted by anyone else.
_NEXT_REVISION = """
local revision = redis.call('INCR', KEYS[1])
local latest = tonumber(redis.call('GET', KEYS[2]) or '0')
if revision <= latest then
  revision = latest + 1
  redis.call('SET', KEYS[1], revision)
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return revision
"""
_POLL_S = 1.0  # the longest single blocking read while waiting (the client may have left)
_MESSAGE_FIELD = re.compile(r"messages\[([0-9]+)\](.*)", re.DOTALL)


# --- the request, read strictly ----------------------------------------------------------------


@dataclass(frozen=True)
class CompactCall:
    """What a body asks: ``items`` (the window; [] when only a previous response is named),
    and whether it named a previous response (its id is never kept: we hold none)."""

    model: str
    items: list[dict[str, Any]]
    previous_response: bool


def read_call(doc: Any) -> CompactCall:
    """The body's fields, checked; :class:`InvalidRequest` names the first wrong one."""
    if not isinstance(doc, dict):
        raise InvalidRequest("", "the body must be a JSON object")
    unknown = sorted(set(doc) - set(READ_FIELDS) - IGNORED_FIELDS)
    if unknown:
        raise InvalidRequest(unknown[0], "unknown field (OpenAI's compact parameters are known)")
    if "model" not in doc:
        raise InvalidRequest("model", "required (the model the window is for)")
    model = _optional_text(doc, "model")
    if len(model) > MAX_MODEL_CHARS:
        raise InvalidRequest("model", f"at most {MAX_MODEL_CHARS} characters")
    _optional_text(doc, "instructions")  # the client sends them with every request itself
    previous = _optional_text(doc, "previous_response_id")
    if doc.get("input") is None and not previous:
        raise InvalidRequest("input", "required: the window to compact (a string or items)")
    items = window_items(doc.get("input"))
    return CompactCall(model=model, items=items, previous_response=bool(previous))


def _optional_text(doc: dict[str, Any], name: str) -> str:
    value = doc.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(name, "must be a string or null")
    return value or ""


def window_items(value: Any) -> list[dict[str, Any]]:
    """``input`` as Responses items: a string is one user message (as OpenAI reads it)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequest("input", "must be a string or a list of items")
    if not value:
        raise InvalidRequest("input", "at least one item: an empty window has nothing to compact")
    for k, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{k}]", "an item must be an object")
    return list(value)


# --- which conversation --------------------------------------------------------------------------


def derived_conversation(items: list[dict[str, Any]]) -> str:
    """The conversation of a window no header names: ``responses-`` and a digest of its opening
    items, up to and including its first user turn (ids left out).

    A session sends its previous output plus its new turns each time. That output opens as its
    input did: the leading system and developer items are never compacted, and the first user
    turn is carried verbatim (without its id) as long as the user turns fit the configured
    ``preserve_recent_user_tokens``. So the session's compacts share one conversation (its
    events, transcripts, recall and undo), while sessions that share only a system prompt do
    not. A summary message of ours is no user turn of the session's: it is passed over."""
    opening = []
    for item in items:
        opening.append({k: v for k, v in item.items() if k != "id"})
        if _is_user_turn(item):
            break
    digest = hashlib.sha256(canonical_json(opening).encode("utf-8")).hexdigest()
    return DERIVED_PREFIX + digest[:32]


def _is_user_turn(item: dict[str, Any]) -> bool:
    if item.get("role") != "user" or item.get("type", "message") != "message":
        return False
    return not _text_of(item.get("content")).startswith(SUMMARY_MARKER)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            return str(part["text"])
    return ""


# --- the answer ----------------------------------------------------------------------------------


def window_tokens(event: CompactionEvent) -> tuple[int, int]:
    """The window's tokens before and after, as the service counts the next request: the
    compaction's own numbers, or, when nothing was applied, the window's size twice."""
    if isinstance(event, CompletedEvent):
        return event.compaction.tokens_before, event.compaction.tokens_after
    if isinstance(event, ProposedEvent):  # held for review: not applied
        return event.compaction.tokens_before, event.compaction.tokens_before
    if isinstance(event, SkippedEvent) and event.trigger is not None:
        return event.trigger.projected_tokens, event.trigger.projected_tokens
    return 0, 0


def compaction_object(event: CompactionEvent, output: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's ``response.compaction``: ``id`` the outcome event's, ``usage`` ours (no provider
    counted these tokens: nothing was read from a cache, nothing reasoned)."""
    before, after = window_tokens(event)
    return {
        "id": event.event_id,
        "object": "response.compaction",
        "created_at": int(event.created_at.timestamp()),
        "output": output,
        "usage": {
            "input_tokens": before,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": after,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": before + after,
        },
    }


def request_field(field: str | None, offset: int) -> str:
    """A snapshot's field (``messages[7].content``) as the request names it
    (``input[2].content`` when the window's items start at ``offset``)."""
    if not field or field == "messages":
        return "input"
    if field.startswith("model"):
        return "model"
    found = _MESSAGE_FIELD.fullmatch(field)
    if found is None or int(found[1]) < offset:
        return field  # the conversation's own (a previous response's) history
    return f"input[{int(found[1]) - offset}]{found[2]}"


def answers(event: CompactionEvent, request_id: str, revision: int) -> bool:
    """Whether ``event`` is the outcome of request ``request_id`` of ``revision``: its
    compaction, skip, failure or hold, or the rejection of the snapshot."""
    if event.type not in OUTCOME_TYPES or event.revision != revision:
        return False
    if isinstance(event, RejectedEvent):
        return True
    trigger = getattr(event, "trigger", None)
    return trigger is not None and trigger.request_id == request_id


# --- the endpoint --------------------------------------------------------------------------------


class ResponsesCompaction:
    """The two routes' handlers, with what one ``serve`` process shares between them."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.turns = _Turns()
        self.workers = _SummarizeWorkers(api)

    async def v1(self, request: Request) -> Response:
        return await self._handle(request, self.api.tenant(request))

    async def proxied(self, request: Request) -> Response:
        """Under the proxy's OpenAI base path: the tenant is ``X-Compactor-Key``'s (the
        agent's own ``Authorization`` is its provider's key, and nothing goes upstream)."""
        given = request.headers.get(KEY_HEADER)
        tenant = self.api.keys.tenant(bearer(given) or given)
        if tenant is None:
            raise ApiError.of(401, "unauthorized", f"{KEY_NAME}: a valid API key is required")
        return await self._handle(request, tenant)

    async def _handle(self, request: Request, tenant: Tenant) -> Response:
        api = self.api
        named = _named(tenant, request.headers.get(CONVERSATION_HEADER))
        try:
            call = read_call(json_body(await api.body(request), api.body_limit))
        except InvalidRequest as exc:
            raise ApiError(422, exc.to_dict()) from None
        if call.previous_response and named is None:
            raise ApiError(422, PREVIOUS_REFUSED.to_dict())
        internal = named or tenant.internal(derived_conversation(call.items))
        try:
            async with self.turns.of(internal):
                snapshot, offset = await self._snapshot(internal, call)
                event = await self._compacted(request, tenant, snapshot, offset)
                output = await self._output(internal, snapshot["messages"], event)
        except _Unanswered as exc:
            return JSONResponse(exc.body, status_code=exc.status, headers=_NO_RETRY)
        log.info("responses/compact %s revision %s: %s", internal, event.revision, event.type)
        return JSONResponse(
            compaction_object(event, output), headers=_headers(tenant.external(internal), event)
        )

    async def _snapshot(self, internal: str, call: CompactCall) -> tuple[dict[str, Any], int]:
        """The snapshot to submit, and where the request's items start in its messages (after
        the newest snapshot's, which stand for a previous response)."""
        base = await self._newest_snapshot(internal) if call.previous_response else {}
        history = list(base.get("messages", []))
        model = dict(base.get("model") or {})
        if call.model or not model.get("name"):
            model["name"] = call.model
        snapshot = {
            "conversation_id": internal,
            "revision": await self._next_revision(internal),
            "format": "responses",
            "model": model,
            "messages": history + call.items,
            # The compaction asked for is the one made: no second one by the threshold.
            "config": dict(base.get("config") or {}) | {"auto_compact_trigger": "off"},
            "tools": dict(base.get("tools") or {}),
        }
        return snapshot, len(history)

    async def _newest_snapshot(self, internal: str) -> dict[str, Any]:
        """The conversation's newest snapshot: what a previous response stands for here."""
        with aredis_errors("reading the conversation's newest snapshot"):
            stored = await self.api.aredis.get(keys.snapshot(internal))
        if not stored:
            raise ApiError.of(
                409,
                "no_snapshot",
                "previous_response_id: the conversation has no snapshot to stand for it (none "
                "submitted, or the newest expired): send the window as input",
            )
        limit = self.api.settings.compaction.max_snapshot_bytes
        doc: dict[str, Any] = decode_json(zlib.decompress(stored), max_bytes=limit)
        if doc.get("format") != "responses":
            raise ApiError.of(
                409,
                "format_mismatch",
                "previous_response_id: the conversation's newest snapshot is of format "
                f"{doc.get('format', 'openai')!r}, not a Responses history",
            )
        return doc

    async def _next_revision(self, internal: str) -> int:
        with aredis_errors("taking the conversation's next revision"):
            revision = await self.api.aredis.eval(
                _NEXT_REVISION,
                2,
                keys.proxy_revision(internal),
                keys.latest(internal),
                self.api.settings.redis.stream_ttl_s,
            )
        return int(revision)

    async def _compacted(
        self, request: Request, tenant: Tenant, snapshot: dict[str, Any], offset: int
    ) -> CompactionEvent:
        """Submit, request the compaction, and wait for its outcome (a refusal or a failure
        as an error)."""
        internal = snapshot["conversation_id"]
        with aredis_errors("reading the conversation's events"):
            after = await anewest_id(self.api.aredis, keys.events(internal))
        await self._submit(snapshot)
        request_id = await self._request(internal, snapshot["revision"])
        event = await self._outcome(
            request, _Wait(internal, request_id, snapshot["revision"], after)
        )
        if isinstance(event, RejectedEvent):
            raise ApiError(422, _rejection(event, offset))
        if isinstance(event, FailedEvent):
            raise ApiError(503, _failure(event, tenant))
        return event

    async def _submit(self, snapshot: dict[str, Any]) -> None:
        try:
            result = await anyio.to_thread.run_sync(self.api.client.submit, snapshot)
        except InvalidSnapshot as exc:
            if "the limit is" in exc.reason:
                raise ApiError(413, InvalidSnapshot("input", exc.reason).to_dict()) from None
            raise ApiError(422, exc.to_dict()) from None
        if result.status == "superseded":
            raise ApiError.of(409, "superseded", SUPERSEDED)

    async def _request(self, internal: str, revision: int) -> str:
        try:
            result = await anyio.to_thread.run_sync(self.api.client.compact_now, internal)
        except NoSnapshot:
            raise ApiError.of(409, "superseded", SUPERSEDED) from None
        if result.revision != revision:
            raise ApiError.of(409, "superseded", SUPERSEDED)
        return result.request_id

    async def _outcome(self, request: Request, waiting: _Wait) -> CompactionEvent:
        """The outcome; or, as soon as no summarize worker answers, 503 (the request stays
        queued for one); or, after ``[worker] summarize_time_limit_s``, 504."""
        outcome = asyncio.ensure_future(self._read_outcome(request, waiting))
        asked = asyncio.ensure_future(self.workers.answer())
        try:
            done, _ = await asyncio.wait({outcome, asked}, return_when=asyncio.FIRST_COMPLETED)
            if outcome not in done and asked.result() is False:
                raise _Unanswered(503, _no_workers(waiting))
            return await outcome
        finally:
            outcome.cancel()
            asked.cancel()  # the question itself goes on (shielded), for the next request

    async def _read_outcome(self, request: Request, waiting: _Wait) -> CompactionEvent:
        limit_s = self.api.settings.worker.summarize_time_limit_s
        deadline = time.monotonic() + limit_s
        stream, after = keys.events(waiting.internal), waiting.after
        while (remaining := deadline - time.monotonic()) > 0:
            if await request.is_disconnected():
                raise ApiError.of(499, "client_closed", "the client left before the outcome")
            block_ms = max(1, int(min(remaining, _POLL_S) * 1000))
            with aredis_errors("waiting for the compaction's outcome"):
                reply = await self.api.aredis.xread({stream: after}, count=100, block=block_ms)
            for entry_id, doc in stream_entries(reply, stream):
                after = entry_id
                event = _event(doc)
                if event is not None and answers(event, waiting.request_id, waiting.revision):
                    return event
        raise _Unanswered(504, _timeout(waiting, limit_s))

    async def _output(
        self, internal: str, messages: list[dict[str, Any]], event: CompactionEvent
    ) -> list[dict[str, Any]]:
        """The window to send next: ``messages`` with the conversation's compactions applied,
        this one included when it completed."""
        result = await compacted_history(self.api, internal, "responses", messages)
        if isinstance(event, CompletedEvent) and result.event_id != event.event_id:
            raise ApiError.of(
                409,
                "conversation_changed",
                "the conversation's compactions changed while this one was made (a restore or "
                "another compaction): compact again",
            )
        return result.messages


PREVIOUS_REFUSED = InvalidRequest(
    "previous_response_id",
    "this service keeps no responses: send the window as input, or name a conversation "
    f"({CONVERSATION_NAME}) whose newest snapshot stands for the previous response",
)
SUPERSEDED = (
    "a newer snapshot of the conversation arrived while this one was submitted: compact again"
)
# The official SDKs retry a 5xx unless told not to; here a retry would ask for a second
# compaction while the first one may still be made.
_NO_RETRY = {"x-should-retry": "false"}


class _Unanswered(Exception):
    """No outcome to answer with (no worker, or not in time): an error the SDKs must not
    retry."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body["message"])
        self.status, self.body = status, body


@dataclass(frozen=True)
class _Wait:
    internal: str
    request_id: str
    revision: int
    after: str  # the stream id before the snapshot was submitted


def _named(tenant: Tenant, header: str | None) -> str | None:
    """The internal id of the conversation the header names, checked before the body is read."""
    if header is None:
        return None
    try:
        return tenant.internal(header)
    except InvalidSnapshot as exc:
        raise ApiError(422, InvalidRequest(CONVERSATION_NAME, exc.reason).to_dict()) from None


def _event(doc: dict[str, Any] | None) -> CompactionEvent | None:
    if doc is None:
        return None
    try:
        return parse_event(doc)
    except ValidationError:
        return None  # not an event this version reads: not the outcome waited for


def _headers(external: str, event: CompactionEvent) -> dict[str, str]:
    code = event.why if isinstance(event, SkippedEvent) else None
    out = {
        "X-Compactor-Conversation": external,
        "X-Compactor-Outcome": Outcome(
            type=event.type, revision=event.revision, code=code
        ).header(),
    }
    if isinstance(event, CompletedEvent):
        out["X-Compactor-Compaction-Id"] = event.event_id
    return out


def _rejection(event: RejectedEvent, offset: int) -> dict[str, Any]:
    """The worker's refusal of the window, naming the request's field."""
    return {
        "error": event.error.code,
        "field": request_field(event.error.field, offset),
        "reason": event.error.message,
    }


def _failure(event: FailedEvent, tenant: Tenant) -> dict[str, Any]:
    """What the tenant is shown of a failure (never a store's location)."""
    shown = tenant.event(event.model_dump(mode="json"))
    return {"error": event.error.code, "message": shown["error"]["message"]}


def _no_workers(waiting: _Wait) -> dict[str, Any]:
    return {
        "error": "no_workers",
        "message": "no worker of the summarize kind answers: the compaction waits in the queue "
        "until one starts (compactor up, or compactor worker); its event will be the "
        "conversation's",
        "request_id": waiting.request_id,
    }


def _timeout(waiting: _Wait, limit_s: float) -> dict[str, Any]:
    return {
        "error": "timeout",
        "message": f"no outcome within {limit_s:g} s ([worker] summarize_time_limit_s): the "
        "compaction may still be made, as the conversation's next requested event",
        "request_id": waiting.request_id,
    }


class _Turns:
    """One compaction at a time per conversation in this process: a second request of the
    conversation would replace the first one's while it waits (``compact_now``)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def of(self, key: str) -> AsyncIterator[None]:
        lock, users = self._held.get(key, (asyncio.Lock(), 0))
        self._held[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._held[key]
            if users == 1:
                del self._held[key]
            else:
                self._held[key] = (lock, users - 1)


class _SummarizeWorkers:
    """Whether a worker of the summarize kind answers the broadcast, asked as ``/readyz``
    asks it (its Celery app, under its lock), at most every ``[http] ready_cache_s``."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._answer: tuple[float, bool] | None = None
        self._asking: asyncio.Future[bool] | None = None

    async def answer(self) -> bool:
        cache_s = self.api.settings.http.ready_cache_s
        if self._answer is not None and time.monotonic() - self._answer[0] < cache_s:
            return self._answer[1]
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._ask())
        # Shielded: a request that stops waiting leaves the answer to the next one.
        return await asyncio.shield(self._asking)

    async def _ask(self) -> bool:
        try:
            async with self.api._ready_lock:
                found = await anyio.to_thread.run_sync(self._summarizers)
        except CompactorError as exc:  # the broker away: no answer; the wait decides
            log.warning("responses/compact: cannot ask the workers: %s", exc.code)
            return True
        self._answer = (time.monotonic(), found)
        return found

    def _summarizers(self) -> bool:
        from worker.runtime.fleet import active_queues, classify_workers

        api = self.api
        if api._celery is None:
            from worker.runtime.celery_app import make_app

            api._celery = make_app(api.settings)
        timeout_s = api.settings.http.ready_timeout_s
        kinds = classify_workers(active_queues(api._celery, timeout_s=timeout_s))
        return bool(kinds["summarize"])


def responses_compact_routes(api: Api) -> list[Route]:
    """``POST /v1/responses/compact``, and the same under the proxy's OpenAI base path."""
    endpoint = ResponsesCompaction(api)
    return [
        Route(V1_PATH, endpoint.v1, methods=["POST"]),
        Route(PROXY_PATH, endpoint.proxied, methods=["POST"]),
    ]
