"""The HTTP API (Starlette): snapshots, events (JSON or a live SSE stream), transcripts,
recall, apply, health, readiness, metrics and the OpenAPI document.

Every ``/v1`` route needs ``Authorization: Bearer <key>``; the key names the tenant, whose
conversation ids are mapped to internal ones (:mod:`worker.api.auth`), and every response
carries the external id again. Sync work (submitting, transcripts, the workers' ping) runs on
worker threads; events are read with Redis' asyncio client (``XREAD BLOCK``), so an idle
follower costs a coroutine and a Redis connection, never a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio.to_thread
import redis
import redis.asyncio
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from worker.api.common import (
    MAX_EVENTS_PER_PAGE,
    NOT_FOUND,
    ApiError,
    after_param,
    aredis_errors,
    external_events,
    int_param,
    integer_param,
    json_body,
    known_id,
)
from worker.api.compact_on_demand import compact_conversation
from worker.api.compacted_history import compacted_route
from worker.api.conversations import (
    approve_compaction,
    decline_compaction,
    list_conversations,
    restore_compaction,
)
from worker.api.inspector import ui_routes
from worker.api.proxy import Proxy, proxy_routes
from worker.api.responses_compact import responses_compact_routes
from worker.api.spec import document_bytes
from worker.api.sse import sse_response
from worker.api.state import Api, api_of
from worker.api.webhooks import UnsafeUrl, Webhooks
from worker.backend import keys
from worker.backend.streams import stream_entries
from worker.config import Settings
from worker.errors import (
    CompactorError,
    EventMismatch,
    InvalidSnapshot,
    RedisUnavailable,
    StorageError,
)
from worker.wire.events import parse_event
from worker.wire.history import apply_compaction
from worker.wire.models import MAX_REVISION

log = logging.getLogger(__name__)


# --- routes ----------------------------------------------------------------------------------


async def submit_snapshot(request: Request) -> Response:
    api = api_of(request)
    tenant = api.tenant(request)
    external = request.path_params["conversation_id"]
    try:
        internal = tenant.internal(external)
    except InvalidSnapshot as exc:
        raise ApiError(422, exc.to_dict()) from None
    head = json_body(await api.body(request), api.body_limit)
    if not isinstance(head, dict):
        raise ApiError(422, InvalidSnapshot("", "a snapshot must be a JSON object").to_dict())
    if head.get("conversation_id") != external:
        reason = "must be the conversation id of the path"
        raise ApiError(422, InvalidSnapshot("conversation_id", reason).to_dict())
    head["conversation_id"] = internal
    try:
        result = await anyio.to_thread.run_sync(api.client.submit, head)
    except InvalidSnapshot as exc:
        status = 413 if "the limit is" in exc.reason else 422
        raise ApiError(status, exc.to_dict()) from None
    return JSONResponse({"status": result.status, "revision": result.revision}, status_code=202)


async def conversation_events(request: Request) -> Response:
    api = api_of(request)
    tenant = api.tenant(request)
    internal = known_id(tenant, request)
    after = after_param(request)
    limit = int_param(request, "limit", 100, 1, MAX_EVENTS_PER_PAGE)
    if not await api.known(internal):
        raise ApiError.of(404, "not_found", NOT_FOUND)
    stream = keys.events(internal)
    if "text/event-stream" in request.headers.get("accept", ""):
        return sse_response(api, stream, tenant, after)
    with aredis_errors("reading events"):
        reply = await api.aredis.xread({stream: after}, count=limit)
    return JSONResponse(external_events(stream_entries(reply, stream), tenant))


async def get_transcript(request: Request) -> Response:
    api = api_of(request)
    tenant = api.tenant(request)
    internal = known_id(tenant, request)
    revision = integer_param(request.path_params["revision"], "revision", 0, MAX_REVISION)
    data = await anyio.to_thread.run_sync(api.transcripts.read_revision, internal, revision)
    if data is None:
        raise ApiError.of(404, "not_found", f"no transcript of revision {revision} is kept")
    doc = json.loads(data)
    doc["conversation_id"] = tenant.external(doc.get("conversation_id", ""))
    return JSONResponse(doc, headers={"X-Transcript-SHA256": hashlib.sha256(data).hexdigest()})


async def recall_message(request: Request) -> Response:
    """The original of a message a compaction replaced, from that compaction's transcript
    (checked against the event's sha256), newest compaction first."""
    api = api_of(request)
    tenant = api.tenant(request)
    internal = known_id(tenant, request)
    found = await api.recall(internal, request.path_params["message_id"])
    return JSONResponse(found | {"conversation_id": tenant.external(found["conversation_id"])})


async def apply(request: Request) -> Response:
    api = api_of(request)
    api.tenant(request)
    doc = json_body(await api.body(request), api.body_limit)
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        raise ApiError.of(422, "invalid_request", "messages: a list of messages is required")
    if not isinstance(doc.get("event"), dict):
        raise ApiError.of(422, "invalid_request", "event: a compaction event is required")
    conversation_id = doc.get("conversation_id")
    if conversation_id is not None and not isinstance(conversation_id, str):
        raise ApiError.of(422, "invalid_request", "conversation_id: must be a string")
    if not all(isinstance(m, dict) for m in doc["messages"]):
        raise ApiError.of(422, "invalid_request", "messages: each message is an object")
    try:
        event = parse_event(doc["event"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ApiError.of(422, "invalid_request", f"event.{where}: {first['msg']}") from None
    try:
        messages = apply_compaction(doc["messages"], event, conversation_id=conversation_id)
    except EventMismatch as exc:
        raise ApiError(409, exc.to_dict()) from None
    return JSONResponse({"messages": messages})


async def create_webhook(request: Request) -> Response:

    api = api_of(request)
    tenant = api.tenant(request)
    doc = json_body(await api.body(request), api.body_limit)
    if not isinstance(doc, dict):
        raise ApiError.of(422, "invalid_request", "a JSON object {url, ...} is required")
    try:
        with aredis_errors("registering a webhook"):
            hook = await request.app.state.webhooks.register(tenant.name, doc)
    except UnsafeUrl as exc:
        raise ApiError.of(422, "unsafe_url", f"url: {exc}") from None
    except ValueError as exc:
        raise ApiError.of(422, "invalid_request", str(exc)) from None
    return JSONResponse(hook, status_code=201)


async def list_webhooks(request: Request) -> Response:
    api = api_of(request)
    tenant = api.tenant(request)
    with aredis_errors("reading webhooks"):
        return JSONResponse(await request.app.state.webhooks.registered(tenant.name))


async def delete_webhook(request: Request) -> Response:
    from worker.api.webhooks import is_webhook_id

    api = api_of(request)
    tenant = api.tenant(request)
    webhook_id = request.path_params["webhook_id"]
    if not is_webhook_id(webhook_id):
        raise ApiError.of(422, "invalid_request", "webhook_id: not a webhook id (wh_...)")
    with aredis_errors("deleting a webhook"):
        found = await request.app.state.webhooks.delete(tenant.name, webhook_id)
    if not found:
        raise ApiError.of(404, "not_found", "no such webhook (for this API key)")
    return Response(status_code=204)


async def healthz(request: Request) -> Response:
    del request
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Redis answers and a worker of each kind (evaluate, summarize) answers; cached for
    ``ready_cache_s``."""
    api = api_of(request)
    async with api._ready_lock:
        now = time.monotonic()
        if api._ready is None or now - api._ready[0] >= api.settings.http.ready_cache_s:
            status, doc = await _check_ready(api)
            api._ready = (time.monotonic(), status, doc)
        _, status, doc = api._ready
    return JSONResponse(doc, status_code=status)


async def _check_ready(api: Api) -> tuple[int, dict[str, Any]]:
    from worker.runtime.fleet import KIND_QUEUES, active_queues, classify_workers

    try:
        await api.aredis.ping()
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        return 503, {"ready": False, "redis": False, "error": type(exc).__name__}

    def kinds() -> dict[str, list[str]]:
        if api._celery is None:
            from worker.runtime.celery_app import make_app

            api._celery = make_app(api.settings)
        return classify_workers(
            active_queues(api._celery, timeout_s=api.settings.http.ready_timeout_s)
        )

    try:
        found = await anyio.to_thread.run_sync(kinds)
    except CompactorError as exc:
        return 503, {"ready": False, "redis": True, "error": exc.code}
    missing = sorted(kind for kind in KIND_QUEUES if not found.get(kind))
    doc = {"ready": not missing, "redis": True, "kinds": found, "missing_kinds": missing}
    return (503 if missing else 200), doc


async def metrics(request: Request) -> Response:
    from worker.backend.queues import broker_url, queue_lengths
    from worker.ops.metrics import render_prometheus

    api = api_of(request)
    state = api.client.state

    def render() -> str:
        return render_prometheus(state.counters(), queue_lengths(broker_url(api.settings)))

    text = await anyio.to_thread.run_sync(render)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def openapi_json(request: Request) -> Response:
    del request
    return Response(document_bytes(), media_type="application/json")


async def _api_error(request: Request, exc: Exception) -> Response:
    del request
    assert isinstance(exc, ApiError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(exc.body, status_code=exc.status, headers=headers)


async def _compactor_error(request: Request, exc: Exception) -> Response:
    del request
    assert isinstance(exc, CompactorError)
    status = 503 if isinstance(exc, RedisUnavailable | StorageError) else 500
    if isinstance(exc, EventMismatch):
        status = 409
    return JSONResponse({"error": exc.code, "message": exc.message}, status_code=status)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own answers (no such route, method not allowed) as JSON like ours."""
    del request
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(
        {"error": code, "message": exc.detail}, status_code=exc.status_code, headers=exc.headers
    )


def create_app(settings: Settings, environ: Mapping[str, str] | None = None) -> Starlette:
    api = Api(settings, environ)
    proxy = Proxy(api)
    if not len(api.keys):
        log.warning("no API keys configured (COMPACTOR_API_KEYS): every /v1 request gets 401")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.api = api
        app.state.proxy = proxy
        app.state.webhooks = webhooks = Webhooks(api)
        webhooks.start()
        try:
            yield
        finally:
            await webhooks.close()
            await proxy.close()
            await api.close()

    conv = "/v1/conversations/{conversation_id}"
    routes = [
        Route(f"{conv}/snapshots", submit_snapshot, methods=["POST"]),
        Route(f"{conv}/events", conversation_events, methods=["GET"]),
        Route(f"{conv}/transcripts/{{revision}}", get_transcript, methods=["GET"]),
        Route(f"{conv}/messages/{{message_id}}", recall_message, methods=["GET"]),
        Route("/v1/conversations/{conversation_id}/compacted", compacted_route, methods=["POST"]),
        Route("/v1/conversations", list_conversations, methods=["GET"]),
        Route(f"{conv}/compactions/{{event_id}}/restore", restore_compaction, methods=["POST"]),
        Route(f"{conv}/compact", compact_conversation, methods=["POST"]),
        Route(f"{conv}/compactions/{{event_id}}/approve", approve_compaction, methods=["POST"]),
        Route(f"{conv}/compactions/{{event_id}}/reject", decline_compaction, methods=["POST"]),
        Route("/v1/apply", apply, methods=["POST"]),
        Route("/v1/webhooks", create_webhook, methods=["POST"]),
        Route("/v1/webhooks", list_webhooks, methods=["GET"]),
        Route("/v1/webhooks/{webhook_id}", delete_webhook, methods=["DELETE"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *proxy_routes(),
        *responses_compact_routes(api),
        *ui_routes(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: _api_error,
            CompactorError: _compactor_error,
            HTTPException: _http_error,
        },
    )
    # A path with an empty last segment (/v1/webhooks/) is a JSON 404, not a redirect (whose
    # body is not JSON) to a route that may take other methods.
    app.router.redirect_slashes = False
    return app
