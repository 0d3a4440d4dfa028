"""A tenant's conversations and their compactions, read for people: the data of the inspector's
pages (:mod:`worker.api.inspector`) and the JSON routes under them.

- ``GET /v1/conversations?limit=&after=``: the tenant's conversations, newest activity first
  (the index ``cw:tenant:{tenant}:conversations``, kept by submit and publish), each with its
  newest outcome and size, and the compactions its next request carries with the tokens they
  save it; ``next`` is the cursor of the following page.
- ``POST /v1/conversations/{id}/compactions/{event_id}/restore``: restore (undo) the newest
  completed compaction (:meth:`worker.backend.redis_state.RedisState.revert`).

- ``POST /v1/conversations/{id}/compactions/{event_id}/approve`` (optionally with an edited
  ``summary``) and ``.../reject``: decide a compaction held for review
  (:class:`worker.api.review.Reviewer`, held by the ``Api`` state object).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.api.auth import Tenant
from worker.api.common import (
    NOT_FOUND,
    ApiError,
    aredis_errors,
    int_param,
    json_body,
    known_id,
)
from worker.api.review import Decision
from worker.api.state import Api, api_of
from worker.backend import keys
from worker.backend.redis_state import LAST_COMPACTIONS
from worker.backend.streams import entry_event
from worker.core.inspection import CompactionView, Timeline, compaction_view, timeline
from worker.errors import InvalidRequest, InvalidSnapshot, StorageError
from worker.wire.events import OUTCOME_TYPES, CompletedEvent
from worker.wire.requests import user_text

MAX_PAGE = 100
MAX_REASON = 1000
# Event ids are 32 hex digits; a newer version's may differ, so only what is safe in a path.
EVENT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
# A page cursor: the last conversation's activity (seconds, as stored) and its id.
_CURSOR = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,20})?):(.{1,128})", re.DOTALL)
# Newest entries read per conversation for its newest outcome in a listing.
_OUTCOME_SCAN = 8


@dataclass(frozen=True)
class ConversationRow:
    """One conversation of a listing, as the tenant names it.

    ``compactions``: the compactions its next request carries (restored ones not counted);
    ``tokens_saved``: how many tokens fewer that request holds than the full history would,
    the sum of what each of them saved (``tokens_before - tokens_after``), over the newest
    ``saved_over`` of them (the service keeps the newest :data:`LAST_COMPACTIONS` together;
    with more, the sum is a lower bound)."""

    conversation_id: str
    last_activity: float
    revision: int | None
    events: int
    outcome: dict[str, Any] | None  # the newest outcome event (tenant's view), if any
    tokens: int | None  # the request's tokens after the newest outcome
    threshold: int | None
    compactions: int = 0
    tokens_saved: int = 0
    saved_over: int = 0

    def document(self) -> dict[str, Any]:
        outcome = self.outcome
        return {
            "conversation_id": self.conversation_id,
            "last_activity": _iso(self.last_activity),
            "revision": self.revision,
            "events": self.events,
            "tokens": self.tokens,
            "threshold": self.threshold,
            "compactions": self.compactions,
            "tokens_saved": self.tokens_saved,
            "last_outcome": None
            if outcome is None
            else {
                "type": outcome.get("type"),
                "revision": outcome.get("revision"),
                "event_id": outcome.get("event_id"),
                "reason": outcome.get("reason"),
            },
        }


@dataclass(frozen=True)
class Page:
    rows: list[ConversationRow]
    next: str | None

    def document(self) -> dict[str, Any]:
        return {"conversations": [r.document() for r in self.rows], "next": self.next}


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def cursor_param(request: Request) -> tuple[float, str] | None:
    raw = request.query_params.get("after")
    if raw is None or raw == "":
        return None
    match = _CURSOR.fullmatch(raw)
    if match is None:
        raise ApiError.of(
            422, "invalid_request", "after: the next cursor of a previous page (TIME:ID)"
        )
    return float(match.group(1)), match.group(2)


async def conversations_page(
    api: Api, tenant: Tenant, limit: int, after: tuple[float, str] | None
) -> Page:
    """The tenant's conversations, newest activity first: ``limit`` of them after the cursor
    ``after`` (the activity and external id of the previous page's last)."""
    with aredis_errors("listing conversations"):
        members = await _members(api, tenant, limit + 1, after)
    rows = await _rows(api, tenant, members[:limit])
    more = len(members) > limit
    last = members[limit - 1] if more else None
    cursor = None if last is None else f"{last[1]!r}:{tenant.external(last[0])}"
    return Page(rows, cursor)


async def _members(
    api: Api, tenant: Tenant, count: int, after: tuple[float, str] | None
) -> list[tuple[str, float]]:
    index = keys.tenant_conversations(tenant.name)
    if after is None:
        reply = await api.aredis.zrevrange(index, 0, count - 1, withscores=True)
        return [(m.decode(), float(s)) for m, s in reply]
    score, external = after
    try:
        member = tenant.internal(external)
    except InvalidSnapshot:
        raise ApiError.of(422, "invalid_request", "after: not a cursor of this API") from None
    # Equal scores come in descending member order: those up to the cursor's were shown.
    reply = await api.aredis.zrevrangebyscore(
        index, score, "-inf", start=0, num=count + 64, withscores=True
    )
    out = [(m.decode(), float(s)) for m, s in reply]
    return [(m, s) for m, s in out if s < score or m < member][:count]


async def _rows(
    api: Api, tenant: Tenant, members: list[tuple[str, float]]
) -> list[ConversationRow]:
    if not members:
        return []
    with aredis_errors("reading conversations"):
        pipe = api.aredis.pipeline(transaction=False)
        for internal, _score in members:
            pipe.get(keys.latest(internal))
            pipe.xlen(keys.events(internal))
            pipe.xrevrange(keys.events(internal), count=_OUTCOME_SCAN)
            pipe.lrange(keys.last_compaction(internal), 0, -1)
        replies = await pipe.execute()
    rows, gone = [], []
    for k, (internal, score) in enumerate(members):
        latest, length, entries, applied = replies[4 * k : 4 * k + 4]
        if latest is None and not length:
            gone.append(internal)  # expired since its last activity
            continue
        outcome = _newest_outcome(entries, keys.events(internal))
        saved = _savings(applied)
        rows.append(
            ConversationRow(
                conversation_id=tenant.external(internal),
                last_activity=score,
                revision=int(latest) if latest is not None else None,
                events=int(length),
                outcome=tenant.event(outcome) if outcome is not None else None,
                tokens=_tokens_after(outcome),
                threshold=_threshold(outcome),
                compactions=len(saved),
                tokens_saved=sum(saved),
                saved_over=len(saved),
            )
        )
    rows = await _counted_beyond_kept(api, tenant, rows)
    if gone:
        with contextlib.suppress(Exception), aredis_errors("trimming the index"):
            await api.aredis.zrem(keys.tenant_conversations(tenant.name), *gone)
    return rows


def _savings(applied: list[bytes]) -> list[int]:
    """What each compaction the next request carries saved it (``cw:{conv}:last``, the newest
    :data:`LAST_COMPACTIONS`, as published; one that cannot be read saved nothing known)."""
    out = []
    for text in applied:
        try:
            compaction = json.loads(text)["compaction"]
            out.append(max(int(compaction["tokens_before"]) - int(compaction["tokens_after"]), 0))
        except (ValueError, KeyError, TypeError):
            out.append(0)
    return out


async def _counted_beyond_kept(
    api: Api, tenant: Tenant, rows: list[ConversationRow]
) -> list[ConversationRow]:
    """``rows``, where a conversation keeps :data:`LAST_COMPACTIONS` compactions (it may have
    more) counted by its composition, which folds them all in."""
    full = [r for r in rows if r.compactions >= LAST_COMPACTIONS]
    if not full:
        return rows
    with aredis_errors("reading compositions"):
        pipe = api.aredis.pipeline(transaction=False)
        for row in full:
            pipe.get(keys.composed(tenant.internal(row.conversation_id)))
        replies = await pipe.execute()
    counts = {r.conversation_id: _composed_count(d) for r, d in zip(full, replies, strict=True)}
    return [
        replace(r, compactions=max(r.compactions, counts.get(r.conversation_id, 0))) for r in rows
    ]


def _composed_count(doc: bytes | None) -> int:
    """How many compactions a composition (``cw:{conv}:composed``) folds in; 0 if unknown."""
    try:
        count = json.loads(doc)["compactions"] if doc is not None else 0
    except (ValueError, KeyError, TypeError):
        return 0
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def _newest_outcome(entries: list[Any], stream: str) -> dict[str, Any] | None:
    for entry_id, fields in entries:
        doc = entry_event(entry_id, fields, stream)
        if doc is not None and doc.get("type") in OUTCOME_TYPES:
            return doc
    return None


def _tokens_after(doc: Mapping[str, Any] | None) -> int | None:
    if doc is None:
        return None
    compaction = doc.get("compaction")
    if isinstance(compaction, Mapping) and isinstance(compaction.get("tokens_after"), int):
        return int(compaction["tokens_after"])
    trigger = doc.get("trigger")
    if isinstance(trigger, Mapping) and isinstance(trigger.get("projected_tokens"), int):
        return int(trigger["projected_tokens"])
    return None


def _threshold(doc: Mapping[str, Any] | None) -> int | None:
    trigger = doc.get("trigger") if doc is not None else None
    if isinstance(trigger, Mapping) and isinstance(trigger.get("threshold_tokens"), int):
        return int(trigger["threshold_tokens"])
    return None


# --- one conversation -----------------------------------------------------------------------


async def conversation_entries(api: Api, internal: str) -> list[tuple[str, dict[str, Any]]]:
    """Every event in the conversation's stream (stream id, its JSON as published: for the
    service's own reading, shown to a tenant only through :meth:`Tenant.event`), oldest
    first; 404 when the conversation does not exist (for this tenant)."""
    if not await api.known(internal):
        raise ApiError.of(404, "not_found", NOT_FOUND)
    stream = keys.events(internal)
    with aredis_errors("reading events"):
        entries = await api.aredis.xrange(stream, count=api.settings.redis.stream_maxlen * 2)
    out = []
    for entry_id, fields in entries:
        doc = entry_event(entry_id, fields, stream)
        if doc is not None:
            out.append((entry_id.decode(), doc))
    return out


def tenant_timeline(tenant: Tenant, entries: list[tuple[str, dict[str, Any]]]) -> Timeline:
    return timeline([(sid, tenant.event(doc)) for sid, doc in entries])


async def conversation_timeline(api: Api, tenant: Tenant, internal: str) -> Timeline:
    return tenant_timeline(tenant, await conversation_entries(api, internal))


async def compaction_page(
    api: Api, tenant: Tenant, internal: str, event_id: str
) -> tuple[CompactionView, Timeline]:
    """One completed (or held) compaction of the conversation beside the messages it replaced,
    read from its transcript (sha256-checked against the event, as recall does)."""
    entries = await conversation_entries(api, internal)
    raw = next((doc for _sid, doc in entries if doc.get("event_id") == event_id), None)
    if raw is None:
        raise ApiError.of(404, "not_found", f"no event {event_id} in this conversation")
    try:
        # A held proposal (a newer type) carries the same compaction: shown the same way.
        event = CompletedEvent.model_validate(raw | {"type": "compaction.completed"})
    except ValueError:
        raise ApiError.of(404, "not_found", f"event {event_id} is not a compaction") from None
    original, problem = await _transcript(api, event)
    view = compaction_view(event, original, raw=raw, transcript_problem=problem)
    return view, tenant_timeline(tenant, entries)


async def _transcript(
    api: Api, event: CompletedEvent
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The messages of the event's transcript, or why they cannot be shown."""
    ref = event.compaction.transcript
    if ref is None:
        return None, "this compaction keeps no transcript"
    try:
        data = await anyio.to_thread.run_sync(api.transcripts.read, ref.uri)
    except (StorageError, InvalidSnapshot):
        return None, "its transcript is no longer kept (pruned), or the store is unavailable"
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        return None, "its transcript does not match the event's sha256"
    try:
        messages = json.loads(data)["messages"]
    except (ValueError, KeyError, TypeError):
        return None, "its transcript cannot be read"
    return messages, None


# --- restore ----------------------------------------------------------------------------------


async def restore(
    api: Api, tenant: Tenant, internal: str, event_id: str, reason: str | None
) -> dict[str, Any]:
    """Restore the conversation's newest completed compaction ``event_id``; the
    ``compaction.reverted`` event as the tenant sees it. 404 when the conversation has no such
    compaction, 409 when it is not the newest or a worker is compacting the conversation."""
    if not EVENT_ID.fullmatch(event_id):
        raise ApiError.of(422, "invalid_request", "event_id: not an event id")
    if not await api.known(internal):
        raise ApiError.of(404, "not_found", NOT_FOUND)
    state = api.client.state
    now = datetime.now(UTC)
    status, event, stream_id = await anyio.to_thread.run_sync(
        state.revert, internal, event_id, reason, now
    )
    if status == "reverted" and event is not None:
        return tenant.event(json.loads(event.to_json())) | {"stream_id": stream_id}
    if status == "busy":
        raise ApiError.of(
            409, "compaction_in_progress", "a worker is compacting this conversation; try again"
        )
    completed = {e.event_id for _sid, e in await api.completed_events(internal)}
    if event_id not in completed:
        raise ApiError.of(404, "not_found", f"no compaction {event_id} to restore")
    raise ApiError.of(
        409, "not_newest", "only the newest compaction of a conversation can be restored"
    )


def reason_of(doc: Any) -> str | None:
    """The optional ``reason`` of a restore request (a JSON object with only that)."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) - {"reason"}:
        raise ApiError.of(422, "invalid_request", 'the body is {"reason": "..."} or empty')
    reason = doc.get("reason")
    if reason is None:
        return None
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ApiError.of(
            422, "invalid_request", f"reason: a string of at most {MAX_REASON} characters"
        )
    try:  # text a person reads in the inspector and in events: no control characters
        return user_text("reason", reason) or None
    except InvalidRequest as exc:
        raise ApiError(422, exc.to_dict()) from None


# --- review before apply ----------------------------------------------------------------------


async def approve(
    api: Api,
    tenant: Tenant,
    internal: str,
    event_id: str,
    summary: str | None,
    *,
    by: str = "api",
) -> dict[str, Any]:
    """Approve the conversation's held compaction ``event_id`` (with ``summary`` as its edited
    summary, if given); the ``compaction.completed`` event as the tenant sees it. 404 when the
    conversation never proposed it, 409 when it is held no more or no longer applies, 422 for
    an edit that is empty or over the bound."""
    await _proposed(api, internal, event_id)
    decision = await _decided(api, internal, event_id, api.reviewer.approve, summary, by)
    return tenant.event(json.loads(decision.event.to_json())) | {"stream_id": decision.stream_id}


async def decline(
    api: Api,
    tenant: Tenant,
    internal: str,
    event_id: str,
    reason: str | None,
    *,
    by: str = "api",
) -> dict[str, Any]:
    """Decline the conversation's held compaction ``event_id``; the ``compaction.declined``
    event as the tenant sees it. 404 / 409 as :func:`approve`."""
    await _proposed(api, internal, event_id)
    decision = await _decided(api, internal, event_id, api.reviewer.decline, reason, by)
    return tenant.event(json.loads(decision.event.to_json())) | {"stream_id": decision.stream_id}


async def _proposed(api: Api, internal: str, event_id: str) -> None:
    if not EVENT_ID.fullmatch(event_id):
        raise ApiError.of(422, "invalid_request", "event_id: not an event id")
    if not await api.known(internal):
        raise ApiError.of(404, "not_found", NOT_FOUND)


async def _decided(
    api: Api, internal: str, event_id: str, decide: Any, value: str | None, by: str
) -> Decision:
    """``decide`` the held compaction; a 404 from it becomes 409 when the conversation did
    propose ``event_id`` (it was decided already)."""
    try:
        decision: Decision = await decide(internal, event_id, value, by=by)
    except ApiError as exc:
        if exc.status != 404:
            raise
        entries = await conversation_entries(api, internal)
        if any(
            doc.get("type") == "compaction.proposed" and doc.get("event_id") == event_id
            for _sid, doc in entries
        ):
            raise ApiError.of(
                409, "not_held", f"compaction {event_id} is no longer held: it was decided"
            ) from None
        raise
    return decision


def summary_of(doc: Any) -> str | None:
    """The optional edited ``summary`` of an approval (a JSON object with only that)."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) - {"summary"}:
        raise ApiError.of(422, "invalid_request", 'the body is {"summary": "..."} or empty')
    summary = doc.get("summary")
    if summary is not None and not isinstance(summary, str):
        raise ApiError.of(422, "invalid_request", "summary: a string (the edited summary)")
    return summary


# --- routes -----------------------------------------------------------------------------------


async def list_conversations(request: Request) -> Response:
    api = api_of(request)
    tenant = api.tenant(request)
    limit = int_param(request, "limit", 20, 1, MAX_PAGE)
    page = await conversations_page(api, tenant, limit, cursor_param(request))
    return JSONResponse(page.document())


@dataclass(frozen=True)
class _OnCompaction:
    """What a decision on one compaction reads: who asks, about which conversation and event,
    and the optional JSON body (None when empty)."""

    api: Api
    tenant: Tenant
    internal: str
    event_id: str
    body: Any


async def _on_compaction(request: Request) -> _OnCompaction:
    api = api_of(request)
    tenant = api.tenant(request)
    internal = known_id(tenant, request)
    body = await api.body(request)
    document = json_body(body, api.body_limit) if body.strip() else None
    return _OnCompaction(api, tenant, internal, request.path_params["event_id"], document)


async def restore_compaction(request: Request) -> Response:
    on = await _on_compaction(request)
    reason = reason_of(on.body)
    return JSONResponse(await restore(on.api, on.tenant, on.internal, on.event_id, reason))


async def approve_compaction(request: Request) -> Response:
    on = await _on_compaction(request)
    summary = summary_of(on.body)
    return JSONResponse(await approve(on.api, on.tenant, on.internal, on.event_id, summary))


async def decline_compaction(request: Request) -> Response:
    on = await _on_compaction(request)
    reason = reason_of(on.body)
    return JSONResponse(await decline(on.api, on.tenant, on.internal, on.event_id, reason))
