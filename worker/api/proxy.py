"""The proxy: agents point their SDK's base URL here and change nothing else.

``POST /proxy/openai/v1/chat/completions``, ``/proxy/openai/v1/responses`` and
``/proxy/anthropic/v1/messages`` go to the configured upstream with the agent's own
``Authorization`` / ``x-api-key`` (passed through, never stored or logged); the reply comes back
as it came, streamed chunk by chunk, errors included.

With ``X-Compactor-Conversation: c-42`` (and ``X-Compactor-Key`` naming the tenant) the proxy
first applies the conversation's compactions to the history the agent sent (all of them at
once when it is the full history, however many there were; :mod:`worker.api.compacted_history`),
forwards the shorter history, and once the reply is complete submits the history the agent sent
plus the reply as the conversation's next snapshot (revision: a counter in Redis,
``cw:{<conv>}:proxyrev``). The snapshot's model has a context window when one is known: the
agent's ``X-Compactor-Context-Window`` header, else the window of the request's ``model`` in
``[proxy.context_windows]`` and the built-in table (:mod:`worker.core.windows`), so that
``auto_compact_threshold_percent`` applies per agent. The reply carries ``X-Compactor-*``
headers saying what was applied, the window used and the conversation's newest outcome.
Without the conversation header a request is forwarded untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from worker.api.auth import Tenant, bearer
from worker.api.common import ApiError, integer_param, json_body
from worker.api.compacted_history import compacted_history
from worker.api.state import Api
from worker.backend import keys
from worker.config import MAX_CONTEXT_WINDOW, MIN_CONTEXT_WINDOW
from worker.core.windows import ContextWindow, window_for
from worker.errors import CompactorError, InvalidSnapshot, TransientError
from worker.wire import formats
from worker.wire.splice import splice_array

log = logging.getLogger(__name__)

# The conversation's next proxy revision, its counter renewed for stream_ttl_s (ARGV[1]).
_NEXT_REVISION = """
local revision = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return revision
"""

CONVERSATION_HEADER = "x-compactor-conversation"
KEY_HEADER = "x-compactor-key"
CONTEXT_WINDOW_HEADER = "x-compactor-context-window"
# The positions in the request's history of the messages carried word for word through every
# compaction: "0, 5" (docs/http.md, "Pins").
PIN_HEADER = "x-compactor-pin"
_PIN_NAME = "X-Compactor-Pin"
# How the agent and the reply spell it (header names are case-insensitive).
_WINDOW_NAME = "X-Compactor-Context-Window"
# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the proxy sets itself.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
    "content-encoding",
}
MAX_REPLY_KEPT = 16 * 1024 * 1024  # a reply larger than this is passed on but not snapshotted


@dataclass(frozen=True)
class Upstream:
    """One proxied API: where it goes, and which history format it carries."""

    provider: str  # "openai" | "anthropic"
    path: str  # appended to the provider's base URL
    wire: str  # the snapshot format: "openai", "anthropic" or "responses"
    history: str  # the body field holding the history


ROUTES = {
    "/proxy/openai/v1/chat/completions": Upstream(
        "openai", "/chat/completions", "openai", "messages"
    ),
    "/proxy/openai/v1/responses": Upstream("openai", "/responses", "responses", "input"),
    "/proxy/anthropic/v1/messages": Upstream("anthropic", "/v1/messages", "anthropic", "messages"),
}


def supported(wire: str) -> bool:
    """Whether the snapshot formats know ``wire``."""
    return wire in formats._MODULES


@dataclass
class _Plan:
    """What a compacting request submits once its reply is in."""

    tenant: Tenant
    internal: str
    upstream: Upstream
    body: dict[str, Any]
    reply: bytearray = field(default_factory=bytearray)
    status: int = 0
    content_type: str = ""
    complete: bool = False
    headers: dict[str, str] = field(default_factory=dict)  # what was applied, for the agent
    window: ContextWindow | None = None  # the model's, when known
    pins: list[int] = field(default_factory=list)  # positions in the history sent


class Proxy:
    def __init__(self, api: Api) -> None:
        self.api = api
        cfg = api.settings.proxy
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(cfg.read_timeout_s, connect=cfg.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=cfg.max_connections, max_keepalive_connections=cfg.max_connections
            ),
            follow_redirects=False,
        )
        self._tasks: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        await self.client.aclose()

    def base_url(self, provider: str) -> str:
        cfg = self.api.settings.proxy
        base = cfg.openai_base_url if provider == "openai" else cfg.anthropic_base_url
        return base.rstrip("/")

    async def handle(self, request: Request) -> Response:
        upstream = ROUTES[request.url.path]
        raw = await self.api.body(request)
        plan = None
        if CONVERSATION_HEADER in request.headers and supported(upstream.wire):
            plan, raw = await self._compacted(request, upstream, raw)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers = {k: v for k, v in headers.items() if not k.lower().startswith("x-compactor-")}
        headers["accept-encoding"] = "identity"
        url = self.base_url(upstream.provider) + upstream.path
        if request.url.query:
            url += "?" + request.url.query
        outgoing = self.client.build_request("POST", url, content=raw, headers=headers)
        try:
            reply = await self.client.send(outgoing, stream=True)
        except httpx.TimeoutException:
            return _error(504, "upstream_timeout", f"the {upstream.provider} upstream timed out")
        except httpx.HTTPError as exc:
            return _error(
                502,
                "upstream_unavailable",
                f"the {upstream.provider} upstream: {type(exc).__name__}",
            )
        back = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP}
        if plan is not None:
            plan.status = reply.status_code
            plan.content_type = reply.headers.get("content-type", "")
            back |= plan.headers | window_headers(plan.window)
        return StreamingResponse(
            self._relay(reply, plan),
            status_code=reply.status_code,
            headers=back,
            background=BackgroundTask(self._finish, plan) if plan is not None else None,
        )

    async def _relay(self, reply: httpx.Response, plan: _Plan | None) -> Any:
        try:
            async for chunk in reply.aiter_raw():
                if plan is not None and len(plan.reply) + len(chunk) <= MAX_REPLY_KEPT:
                    plan.reply += chunk
                yield chunk
            if plan is not None:
                plan.complete = True
        finally:
            await reply.aclose()

    async def _compacted(
        self, request: Request, upstream: Upstream, raw: bytes
    ) -> tuple[_Plan | None, bytes]:
        """The request with the conversation's matching compactions applied. A history this
        proxy cannot read as a list of items (the Responses API also takes a plain string as
        ``input``) goes upstream as it came, and is not submitted: the proxy never refuses a
        request the provider would take (a bad ``X-Compactor-Context-Window`` is refused: the
        header is ours, never the provider's)."""
        given = request.headers.get(KEY_HEADER)
        tenant = self.api.keys.tenant(bearer(given) or given)
        if tenant is None:
            raise ApiError.of(401, "unauthorized", f"{KEY_HEADER}: a valid API key is required")
        try:
            internal = tenant.internal(request.headers[CONVERSATION_HEADER])
        except InvalidSnapshot as exc:
            raise ApiError(422, exc.to_dict()) from None
        stated = given_window(request)
        body = json_body(raw, self.api.body_limit)
        history = body.get(upstream.history) if isinstance(body, dict) else None
        if not isinstance(history, list) or not all(isinstance(m, dict) for m in history):
            log.info("proxy: %s is not a list of items; forwarded as it came", upstream.history)
            return None, raw
        pins = given_pins(request, len(history))
        plan = _Plan(tenant, internal, upstream, body, window=self._window(stated, body), pins=pins)
        try:
            result = await compacted_history(self.api, internal, upstream.wire, history)
        except TransientError as exc:  # Redis away: the agent's request still goes, as it came
            log.warning("proxy: forwarding %s uncompacted: %s", internal, exc.code)
            plan.headers = {
                "X-Compactor-Compactions": "0",
                "X-Compactor-Warning": f"{exc.code}: sent uncompacted",
            }
            return plan, raw
        plan.headers = result.headers()
        if not result.applied:
            return plan, raw
        # What the compactions left as it was goes upstream as the agent sent it, byte for
        # byte (a provider's compaction block, signed thinking, encrypted items); only the new
        # messages are written.
        spliced = splice_array(raw, upstream.history, history, result.messages)
        if spliced is not None:
            return plan, spliced
        forwarded = body | {upstream.history: result.messages}
        return plan, json.dumps(forwarded, ensure_ascii=False).encode("utf-8")

    def _window(self, given: int | None, body: dict[str, Any]) -> ContextWindow | None:
        """The window the agent gave, else the one of the request's model, if known."""
        if given is not None:
            return ContextWindow(given, "header")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return None
        cfg = self.api.settings.proxy
        return window_for(model, cfg.context_windows, builtin=cfg.builtin_context_windows)

    async def _finish(self, plan: _Plan | None) -> None:
        """After the reply: submit the history the agent sent plus the reply (in the
        background, so the agent's response is never held)."""
        if plan is None or not plan.complete or not 200 <= plan.status < 300:
            return
        task = asyncio.create_task(self._submit(plan))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, plan: _Plan) -> None:
        try:
            message = reply_message(plan.upstream.wire, bytes(plan.reply), plan.content_type)
            history = list(plan.body[plan.upstream.history])
            if message is not None:
                history.append(message)
            counter = keys.proxy_revision(plan.internal)
            # One script, not MULTI: redis-py's asyncio cluster client mishandles transactions
            # (its connections outlive the pipeline), and a script is atomic everywhere.
            revision = await self.api.aredis.eval(
                _NEXT_REVISION, 1, counter, self.api.settings.redis.stream_ttl_s
            )
            snapshot: dict[str, Any] = {
                "conversation_id": plan.internal,
                "revision": int(revision),
                "format": plan.upstream.wire,
                "model": _model_info(plan),
                "messages": history,
            }
            if plan.upstream.wire == "anthropic" and plan.body.get("system") is not None:
                snapshot["system"] = plan.body["system"]
            if plan.pins:
                ids = formats.source_ids(history)
                snapshot["pinned"] = [ids[i] for i in plan.pins]
            await anyio.to_thread.run_sync(self.api.client.submit, snapshot)
        except (CompactorError, ValueError, KeyError, TypeError, OSError) as exc:
            # Never the request or its headers: they may carry the agent's credentials.
            log.warning(
                "proxy: could not submit a snapshot of %s: %s", plan.internal, type(exc).__name__
            )
        except Exception:  # a bug: logged, never raised into the server
            log.exception("proxy: submitting a snapshot of %s failed", plan.internal)


def given_window(request: Request) -> int | None:
    """The agent's ``X-Compactor-Context-Window`` (None: not given); a 422 naming the header
    when it is not one integer in range."""
    values = request.headers.getlist(CONTEXT_WINDOW_HEADER)
    if not values:
        return None
    if len(values) > 1:
        raise ApiError.of(422, "invalid_request", f"{_WINDOW_NAME}: given more than once")
    return integer_param(values[0].strip(), _WINDOW_NAME, MIN_CONTEXT_WINDOW, MAX_CONTEXT_WINDOW)


def given_pins(request: Request, length: int) -> list[int]:
    """The positions ``X-Compactor-Pin`` names (comma-separated, in the history the request
    carries); a 422 naming the header for anything but such positions."""
    values = ",".join(request.headers.getlist(PIN_HEADER))
    pins: list[int] = []
    for part in filter(None, (p.strip() for p in values.split(","))):
        if not (part.isascii() and part.isdigit() and len(part) <= 9) or int(part) >= length:
            raise ApiError.of(
                422,
                "invalid_request",
                f"{_PIN_NAME}: {part[:20]!r} is no position in the {length} messages sent",
            )
        pins.append(int(part))
    return sorted(set(pins))


def window_headers(window: ContextWindow | None) -> dict[str, str]:
    """The reply's report of the window the snapshot carries: its size, and where it came from
    (``header``, or ``config`` / ``builtin`` with the table's name the model matched, as an RFC
    8941 item: ``builtin;model="gpt-4.1"``). None: no headers (the absolute threshold
    decides)."""
    if window is None:
        return {}
    origin = f'{window.origin};model="{window.name}"' if window.name else window.origin
    return {_WINDOW_NAME: str(window.tokens), f"{_WINDOW_NAME}-Origin": origin}


def _model_info(plan: _Plan) -> dict[str, Any]:
    info: dict[str, Any] = {"name": str(plan.body.get("model", ""))[:256]}
    if plan.window is not None:
        info["context_window"] = plan.window.tokens
    return info


def reply_message(wire: str, raw: bytes, content_type: str) -> dict[str, Any] | None:
    """The assistant message of a complete reply (JSON or a streamed one), in the request's
    wire format; None when it has none."""
    if "text/event-stream" in content_type:
        return _streamed_message(wire, raw)
    doc = json.loads(raw)
    if wire == "anthropic":
        return {"role": "assistant", "content": doc["content"]} if doc.get("content") else None
    if wire == "openai":
        return _openai_message(doc["choices"][0]["message"])
    return None


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("refusal"):
        out["refusal"] = message["refusal"]
    if message.get("tool_calls"):
        out["tool_calls"] = [_openai_call(call) for call in message["tool_calls"]]
    return out


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call of a reply as the history holds it: a custom tool's (``custom``: its name
    and free-form input) or a function's."""
    if call.get("type") == "custom" or "custom" in call:
        custom = call.get("custom") or {}
        spec = {"name": custom.get("name") or "", "input": custom.get("input") or ""}
        return {"id": call["id"], "type": "custom", "custom": spec}
    fn = call.get("function") or {}
    spec = {"name": fn.get("name") or "", "arguments": fn.get("arguments") or ""}
    return {"id": call["id"], "type": "function", "function": spec}


def _add_call_delta(slot: dict[str, Any], call: dict[str, Any]) -> None:
    """One streamed piece of a tool call into what was gathered of it so far."""
    slot["id"] = call.get("id") or slot["id"]
    if call.get("type"):
        slot["type"] = call["type"]
    for kind, fields in (("function", ("name", "arguments")), ("custom", ("name", "input"))):
        piece = call.get(kind)
        if isinstance(piece, dict):
            gathered = slot.setdefault(kind, dict.fromkeys(fields, ""))
            for name in fields:
                gathered[name] += piece.get(name) or ""


def _sse_data(raw: bytes) -> list[Any]:
    out = []
    for line in raw.decode("utf-8").splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                out.append(json.loads(data))
    return out


def _streamed_message(wire: str, raw: bytes) -> dict[str, Any] | None:
    chunks = _sse_data(raw)
    if wire == "openai":
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        for chunk in chunks:
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                text.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    _add_call_delta(calls.setdefault(call.get("index", 0), {"id": ""}), call)
        message: dict[str, Any] = {"content": "".join(text)}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return _openai_message(message)
    if wire == "anthropic":
        blocks: dict[int, dict[str, Any]] = {}
        partial: dict[int, str] = {}
        for event in chunks:
            kind, index = event.get("type"), event.get("index", 0)
            if kind == "content_block_start":
                blocks[index] = dict(event["content_block"])
            elif kind == "content_block_delta":
                delta = event.get("delta") or {}
                block = blocks.setdefault(index, {"type": "text", "text": ""})
                if delta.get("type") == "text_delta":
                    block["text"] = block.get("text", "") + delta.get("text", "")
                elif delta.get("type") == "input_json_delta":
                    partial[index] = partial.get(index, "") + delta.get("partial_json", "")
                elif delta.get("type") == "thinking_delta":
                    block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
                elif delta.get("type") == "signature_delta":
                    block["signature"] = delta.get("signature", "")
        for index, text_json in partial.items():
            blocks[index]["input"] = json.loads(text_json) if text_json else {}
        content = [blocks[i] for i in sorted(blocks)]
        return {"role": "assistant", "content": content} if content else None
    return None


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": code, "message": message}, status_code=status)


async def _handle(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    return await proxy.handle(request)


def proxy_routes() -> list[Route]:
    return [Route(path, _handle, methods=["POST"]) for path in ROUTES]
