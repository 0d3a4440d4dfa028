"""The HTTP API (Starlette): snapshots, events (JSON or a live SSE stream), transcripts,
recall, apply, health, readiness, metrics and the OpenAPI document.

Every ``/v1`` route needs ``Authorization: Bearer <key>``; the key names the tenant, whose
conversation ids are mapped to internal ones (:mod:`worker.api.auth`), and every response
carries the external id again. Sync work (submitting, transcripts, the workers' ping) runs on
worker threads; events are read with Redis' asyncio client (``XREAD BLOCK``), so an idle
follower costs a coroutine and a Redis connection, never a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
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
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from worker import formats, keys
from worker.api.auth import ApiKeys, Tenant, bearer, load_api_keys
from worker.api.spec import openapi
from worker.client import Client
from worker.config import Settings
from worker.errors import (
    CompactorError,
    ConfigError,
    EventMismatch,
    InvalidSnapshot,
    RedisUnavailable,
    StorageError,
)
from worker.events import CompletedEvent, parse_event
from worker.history import apply_compaction
from worker.models import MAX_REVISION
from worker.redis_state import (
    anewest_id,
    await_entries,
    connect_async,
    state_url,
    stream_entries,
)
from worker.snapshots import decode_json

log = logging.getLogger(__name__)

# Numbers in paths, queries and headers: ASCII digits only ("\d" and str.isdigit() take
# superscripts and other scripts' digits, which int() refuses or reads as another number), and
# few of them, so int() never meets its digit limit.
_DIGITS = re.compile(r"[0-9]{1,20}")
_STREAM_ID = re.compile(r"0|\$|[0-9]{1,20}(-[0-9]{1,20})?")
# Each part of a stream id (ms-seq) is an unsigned 64-bit integer; Redis answers a larger one
# with an error, so it is refused here, before Redis sees it.
STREAM_ID_PART_MAX = 2**64 - 1
STREAM_ID_RULE = (
    f"a stream id like 1700000000000-0 (ms-seq, each part at most {STREAM_ID_PART_MAX})"
)
MAX_EVENTS_PER_PAGE = 1000
MAX_MESSAGE_ID = 256


class ApiError(Exception):
    """An answer other than success: ``status`` and the JSON body."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        super().__init__(body.get("message") or body.get("reason") or body.get("error"))
        self.status, self.body = status, dict(body)

    @classmethod
    def of(cls, status: int, code: str, message: str) -> ApiError:
        return cls(status, {"error": code, "message": message})


NOT_FOUND = "no such conversation (for this API key)"


class Api:
    """The state one ``serve`` process shares between requests."""

    def __init__(self, settings: Settings, environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.keys: ApiKeys = load_api_keys(settings, os.environ if environ is None else environ)
        self.url = state_url(settings)
        self.client = Client(settings)
        self.aredis: Any = connect_async(
            self.url, max_connections=settings.http.redis_max_connections
        )
        self.transcripts = self.client.store
        self.body_limit = settings.http.max_body_bytes or settings.compaction.max_snapshot_bytes
        self._ready: tuple[float, int, dict[str, Any]] | None = None
        self._ready_lock = asyncio.Lock()
        self._celery: Any = None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.aredis.aclose()
        await anyio.to_thread.run_sync(self.client.close)
        if self._celery is not None:
            self._celery.close()

    # --- helpers ---------------------------------------------------------------------------

    def tenant(self, request: Request) -> Tenant:
        tenant = self.keys.tenant(bearer(request.headers.get("authorization")))
        if tenant is None:
            raise ApiError.of(401, "unauthorized", "a valid API key is required (Bearer)")
        return tenant

    async def body(self, request: Request) -> bytes:
        """The request body, at most ``body_limit`` bytes, within ``body_timeout_s``."""
        return await read_body(request, self.body_limit, self.settings.http.body_timeout_s)

    async def known(self, internal: str) -> bool:
        """Whether the tenant's conversation exists (submitted or with events)."""
        with _redis("checking the conversation"):
            return bool(await self.aredis.exists(keys.events(internal), keys.latest(internal)))

    async def completed_events(self, internal: str) -> list[tuple[str, CompletedEvent]]:
        """The conversation's completed events in its stream, newest first."""
        with _redis("reading events"):
            entries = await self.aredis.xrevrange(
                keys.events(internal), count=self.settings.redis.stream_maxlen
            )
        out = []
        for entry_id, fields in entries:
            with contextlib.suppress(ValueError):
                event = parse_event(fields[b"event"])
                if isinstance(event, CompletedEvent):
                    out.append((entry_id.decode(), event))
        return out


def _external_events(
    entries: list[tuple[str, dict[str, Any] | None]], tenant: Tenant
) -> list[dict[str, Any]]:
    """Stream entries (:func:`worker.redis_state.stream_entries`) as the tenant sees them
    (:meth:`Tenant.event`); an entry that holds no JSON event is left out (it was warned
    about)."""
    return [tenant.event(doc) | {"stream_id": sid} for sid, doc in entries if doc is not None]


@contextlib.contextmanager
def _redis(action: str) -> Any:
    """redis.asyncio errors into the error tree (as worker.redis_state does for the sync
    client)."""
    try:
        yield
    except redis.exceptions.AuthenticationError:
        raise ConfigError("redis.url", "Redis refused the credentials") from None
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        raise RedisUnavailable(f"redis unavailable while {action}: {type(exc).__name__}") from None


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and _DIGITS.fullmatch(declared) and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(size, limit)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError.of(
            408, "timeout", f"the body did not arrive within {timeout_s:g} s"
        ) from None
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        InvalidSnapshot("", f"the body is {size}+ bytes; the limit is {limit}").to_dict(),
    )


def _json_body(data: bytes, limit: int) -> Any:
    try:
        return decode_json(data, max_bytes=limit)
    except InvalidSnapshot as exc:
        raise ApiError(400, exc.to_dict()) from None


def _api(request: Request) -> Api:
    api: Api = request.app.state.api
    return api


# --- routes ----------------------------------------------------------------------------------


async def submit_snapshot(request: Request) -> Response:
    api = _api(request)
    tenant = api.tenant(request)
    external = request.path_params["conversation_id"]
    try:
        internal = tenant.internal(external)
    except InvalidSnapshot as exc:
        raise ApiError(422, exc.to_dict()) from None
    head = _json_body(await api.body(request), api.body_limit)
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
    api = _api(request)
    tenant = api.tenant(request)
    internal = _known_id(tenant, request)
    after = _after(request)
    limit = _int_param(request, "limit", 100, 1, MAX_EVENTS_PER_PAGE)
    if not await api.known(internal):
        raise ApiError.of(404, "not_found", NOT_FOUND)
    stream = keys.events(internal)
    if "text/event-stream" in request.headers.get("accept", ""):
        return StreamingResponse(
            _sse(api, stream, tenant, after),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    with _redis("reading events"):
        reply = await api.aredis.xread({stream: after}, count=limit)
    return JSONResponse(_external_events(stream_entries(reply, stream), tenant))


async def _sse(api: Api, stream: str, tenant: Tenant, after: str) -> AsyncIterator[bytes]:
    """Each event as ``id: <stream id>`` + ``data: <json>``; a comment when idle. A client
    that reconnects with ``Last-Event-ID`` resumes after the last event it saw."""
    block_ms = int(api.settings.http.sse_keepalive_s * 1000)

    async def read(block: int) -> Any:
        return await api.aredis.xread({stream: after}, count=100, block=block)

    yield b"retry: 1000\n\n"
    while True:
        try:
            if after == "$":  # fixed once: "$" read afresh would miss events between reads
                after = await anewest_id(api.aredis, stream)
            reply = await await_entries(read, block_ms)
        except (
            redis.exceptions.RedisError,
            redis.exceptions.RedisClusterException,
            OSError,
        ) as exc:
            log.warning("event stream: redis unavailable (%s); retrying", type(exc).__name__)
            yield b": redis unavailable, retrying\n\n"
            await asyncio.sleep(1.0)
            continue
        if not reply:
            yield b": keep-alive\n\n"
            continue
        entries = stream_entries(reply, stream)
        after = entries[-1][0]  # past an unreadable entry too
        out = []
        for doc in _external_events(entries, tenant):
            data = json.dumps(doc, ensure_ascii=False)
            out.append(f"id: {doc['stream_id']}\ndata: {data}\n\n".encode())
        if out:
            yield b"".join(out)


def _known_id(tenant: Tenant, request: Request) -> str:
    try:
        return tenant.internal(request.path_params["conversation_id"])
    except InvalidSnapshot as exc:
        raise ApiError(422, exc.to_dict()) from None


def _after(request: Request) -> str:
    """Where the events start: ``Last-Event-ID`` (an SSE client resuming), else ``after``."""
    header = request.headers.get("last-event-id")
    name, raw = (
        ("Last-Event-ID", header) if header else ("after", request.query_params.get("after", "0"))
    )
    if _STREAM_ID.fullmatch(raw) and all(
        int(part) <= STREAM_ID_PART_MAX for part in raw.split("-") if part != "$"
    ):
        return raw
    raise ApiError.of(422, "invalid_request", f"{name}: not {STREAM_ID_RULE}")


def _integer(raw: str, name: str, low: int, high: int) -> int:
    if _DIGITS.fullmatch(raw) and low <= int(raw) <= high:
        return int(raw)
    raise ApiError.of(
        422, "invalid_request", f"{name}: an integer from {low} to {high} (ASCII digits)"
    )


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    return default if raw is None else _integer(raw, name, low, high)


async def get_transcript(request: Request) -> Response:
    api = _api(request)
    tenant = api.tenant(request)
    internal = _known_id(tenant, request)
    revision = _integer(request.path_params["revision"], "revision", 0, MAX_REVISION)
    data = await anyio.to_thread.run_sync(api.transcripts.read_revision, internal, revision)
    if data is None:
        raise ApiError.of(404, "not_found", f"no transcript of revision {revision} is kept")
    doc = json.loads(data)
    doc["conversation_id"] = tenant.external(doc.get("conversation_id", ""))
    return JSONResponse(doc, headers={"X-Transcript-SHA256": hashlib.sha256(data).hexdigest()})


async def recall_message(request: Request) -> Response:
    """The original of a message a compaction replaced, from that compaction's transcript
    (checked against the event's sha256), newest compaction first."""
    api = _api(request)
    tenant = api.tenant(request)
    internal = _known_id(tenant, request)
    message_id = request.path_params["message_id"]
    if len(message_id) > MAX_MESSAGE_ID:
        raise ApiError.of(
            422, "invalid_request", f"message_id: at most {MAX_MESSAGE_ID} characters"
        )
    for stream_id, event in await api.completed_events(internal):
        ref = event.compaction.transcript
        if ref is None:
            continue
        try:
            data = await anyio.to_thread.run_sync(api.transcripts.read, ref.uri)
        except (StorageError, InvalidSnapshot):
            continue  # pruned meanwhile
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            log.warning("transcript %s does not match its event's sha256", ref.uri)
            continue
        messages = json.loads(data)["messages"]
        ids = formats.source_ids(messages)
        c = event.compaction
        try:
            start = ids.index(c.first_id)
            last = ids.index(c.last_id, start)
        except ValueError:
            continue
        if message_id in ids[start : last + 1]:
            index = ids.index(message_id, start)
            return JSONResponse(
                {
                    "conversation_id": tenant.external(event.conversation_id),
                    "message_id": message_id,
                    "message": messages[index],
                    "revision": event.revision,
                    "event_id": event.event_id,
                    "stream_id": stream_id,
                    "transcript_sha256": ref.sha256,
                }
            )
    raise ApiError.of(404, "not_found", f"no kept compaction replaced message {message_id!r}")


async def apply(request: Request) -> Response:
    api = _api(request)
    api.tenant(request)
    doc = _json_body(await api.body(request), api.body_limit)
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
    from worker.api.webhooks import UnsafeUrl

    api = _api(request)
    tenant = api.tenant(request)
    doc = _json_body(await api.body(request), api.body_limit)
    if not isinstance(doc, dict):
        raise ApiError.of(422, "invalid_request", "a JSON object {url, ...} is required")
    try:
        with _redis("registering a webhook"):
            hook = await request.app.state.webhooks.register(tenant.name, doc)
    except UnsafeUrl as exc:
        raise ApiError.of(422, "unsafe_url", f"url: {exc}") from None
    except ValueError as exc:
        raise ApiError.of(422, "invalid_request", str(exc)) from None
    return JSONResponse(hook, status_code=201)


async def list_webhooks(request: Request) -> Response:
    api = _api(request)
    tenant = api.tenant(request)
    with _redis("reading webhooks"):
        return JSONResponse(await request.app.state.webhooks.registered(tenant.name))


async def delete_webhook(request: Request) -> Response:
    from worker.api.webhooks import is_webhook_id

    api = _api(request)
    tenant = api.tenant(request)
    webhook_id = request.path_params["webhook_id"]
    if not is_webhook_id(webhook_id):
        raise ApiError.of(422, "invalid_request", "webhook_id: not a webhook id (wh_...)")
    with _redis("deleting a webhook"):
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
    api = _api(request)
    async with api._ready_lock:
        now = time.monotonic()
        if api._ready is None or now - api._ready[0] >= api.settings.http.ready_cache_s:
            status, doc = await _check_ready(api)
            api._ready = (time.monotonic(), status, doc)
        _, status, doc = api._ready
    return JSONResponse(doc, status_code=status)


async def _check_ready(api: Api) -> tuple[int, dict[str, Any]]:
    from worker.cli_service import KIND_QUEUES, active_queues, classify_workers

    try:
        await api.aredis.ping()
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        return 503, {"ready": False, "redis": False, "error": type(exc).__name__}

    def kinds() -> dict[str, list[str]]:
        if api._celery is None:
            from worker.celery_app import make_app

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
    from worker.metrics import render_prometheus
    from worker.queues import broker_url, queue_lengths

    api = _api(request)
    state = api.client.state

    def render() -> str:
        return render_prometheus(state.counters(), queue_lengths(broker_url(api.settings)))

    text = await anyio.to_thread.run_sync(render)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def openapi_json(request: Request) -> Response:
    del request
    return JSONResponse(openapi())


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
    from worker.api.compacted import compacted_route
    from worker.api.proxy import Proxy, proxy_routes
    from worker.api.webhooks import Webhooks

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
        Route("/v1/apply", apply, methods=["POST"]),
        Route("/v1/webhooks", create_webhook, methods=["POST"]),
        Route("/v1/webhooks", list_webhooks, methods=["GET"]),
        Route("/v1/webhooks/{webhook_id}", delete_webhook, methods=["DELETE"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *proxy_routes(),
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
