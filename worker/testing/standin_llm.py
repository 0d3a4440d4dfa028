"""A stand-in LLM provider: a real HTTP/1.1 server on loopback speaking both wire formats.

It answers OpenAI Chat Completions (``POST /v1/chat/completions`` or ``/chat/completions``) and
Anthropic Messages (``POST /v1/messages`` or ``/messages``) with a deterministic summary derived
from the request, so results are checkable: the summary lists the file paths and ``ABC-123``-style
identifiers found in the user message, in order, and a digest of it, cut to about ``max_tokens``
(two characters a token, so it usually fits). A request with ``"stream": true`` is answered
as the provider streams (Server-Sent Events, written in several pieces).

In tests::

    with StandinLLM(latency_s=0.01) as llm:
        llm.enqueue(Fault(status=429, retry_after="1"), Fault(status=503))  # the next two
        llm.default_fault = Fault(status=500)                                # every one after
        ...  # point LLMConfig.base_url at llm.openai_base_url or llm.anthropic_base_url
        llm.requests  # what it received: path, headers (auth redacted), parsed body

On its own (benchmarks, demos)::

    python -m worker.testing.standin_llm --port 8808 --latency-s 2

It binds to 127.0.0.1 only. ``GET /_stats`` returns request and concurrency counters.
docs/testing.md is the guide (what it answers, its guarantees and limits).

Built on asyncio streams (stdlib only): thousands of idle keep-alive connections and sleeping
requests cost a coroutine each, and a hung request is just a coroutine waiting for the client
to give up or the server to stop, so shutdown is immediate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import http
import json
import re
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.testing.llm_schema import anthropic_messages_errors, openai_chat_errors

__all__ = ["Fault", "RecordedRequest", "StandinLLM", "main", "standin_summary"]

_HOST = "127.0.0.1"
_MAX_BODY_BYTES = 32 * 1024 * 1024
_ROUTES = {
    "/v1/chat/completions": "openai",
    "/chat/completions": "openai",
    "/v1/messages": "anthropic",
    "/messages": "anthropic",
}
_SECRET_HEADER = re.compile(r"authorization|api-key|apikey|token|secret|cookie", re.IGNORECASE)
_TERM = re.compile(
    r"(?:[\w.-]+/)+[\w.-]*\w"  # paths with a slash
    r"|\b[\w-]+\.(?:py|md|txt|json|toml|yaml|yml|js|ts|rs|go|sh|cfg|ini|log)\b"
    r"|\b[A-Z][A-Z0-9]*-\d+\b"  # identifiers such as CHUNK-7 or ERR-42
)


@dataclass(frozen=True)
class Fault:
    """How to answer one request. The default is a normal, successful answer."""

    status: int = 200
    retry_after: str | None = None  # the Retry-After header to send, as given
    latency_s: float | None = None  # instead of the server's latency
    body: bytes | None = None  # a raw body instead of the answer (malformed JSON, HTML...)
    empty: bool = False  # a well-formed answer with no text
    text: str | None = None  # this text as the answer (a model's own words: degenerate, tagged...)
    overlong: bool = False  # ignore max_tokens and write several times as much
    hang: bool = False  # never answer; wait for the client to give up
    drop: bool = False  # close the connection without answering


_OK = Fault()


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names; credential values replaced by "[redacted]"
    auth_present: bool  # a credential header was sent
    auth_valid: bool | None  # it matched ``expected_key`` (None when no key is expected)
    body: Any  # the parsed JSON body, or None
    wire: str | None  # "openai", "anthropic" or None for other paths
    fault: Fault
    received_at: float = field(default_factory=time.monotonic)
    raw_body: bytes = b""  # the body's bytes, as they arrived

    @property
    def user_text(self) -> str:
        """The (last) user message's text: what the bound on conversation text applies to."""
        return _user_text(self.body)

    @property
    def system_text(self) -> str:
        return _system_text(self.body, self.wire)

    @property
    def max_tokens(self) -> int | None:
        return _max_tokens(self.body)


class StandinLLM:
    """The server. Use as a context manager (background thread) or run :meth:`serve` directly."""

    def __init__(
        self,
        *,
        port: int = 0,
        latency_s: float = 0.0,
        expected_key: str | None = None,
        echo_key_in_errors: bool = False,
    ) -> None:
        self.latency_s = latency_s
        self.port = port
        self._expected_key = expected_key
        self._echo_key = echo_key_in_errors  # a careless provider quoting the key back
        self._lock = threading.Lock()
        self._faults: deque[Fault] = deque()
        self._default = _OK
        self._requests: list[RecordedRequest] = []
        self._stats = {"requests": 0, "in_flight": 0, "in_flight_peak": 0}
        self._stats |= {"connections": 0, "connections_peak": 0, "connections_accepted": 0}
        self._connections: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._gate: asyncio.Event | None = None  # set: requests proceed; clear: they wait
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # --- control (any thread) -------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    def enqueue(self, *faults: Fault) -> None:
        """Answer the next requests with these faults, in order; then ``default_fault``."""
        with self._lock:
            self._faults.extend(faults)

    @property
    def default_fault(self) -> Fault:
        return self._default

    @default_fault.setter
    def default_fault(self, fault: Fault) -> None:
        with self._lock:
            self._default = fault

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def reset(self) -> None:
        """Forget the recorded requests, the queued faults, the counters and the default fault."""
        with self._lock:
            self._faults.clear()
            self._default = _OK
            self._requests.clear()
            self._stats.update(requests=0, connections_accepted=0)
            self._stats.update(in_flight_peak=self._stats["in_flight"])
            self._stats.update(connections_peak=self._stats["connections"])

    def hold(self) -> None:
        """Keep every request from now on waiting (counted in flight) until :meth:`release`."""
        self._in_loop(lambda gate: gate.clear())

    def release(self) -> None:
        self._in_loop(lambda gate: gate.set())

    def _in_loop(self, action: Callable[[asyncio.Event], None]) -> None:
        loop, gate = self._loop, self._gate
        if loop is None or gate is None:
            raise RuntimeError("the stand-in LLM is not running in a background thread")
        done = threading.Event()

        def run() -> None:
            action(gate)
            done.set()

        loop.call_soon_threadsafe(run)
        done.wait(5)

    def start(self) -> StandinLLM:
        self._thread = threading.Thread(target=self._thread_main, name="standin-llm", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"the stand-in LLM did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop may have just finished
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> StandinLLM:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self.serve())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    # --- serving (the server's loop) ------------------------------------------------------

    async def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve until :meth:`stop` (or :meth:`shutdown` from the loop)."""
        self._stopping = asyncio.Event()
        self._gate = asyncio.Event()
        self._gate.set()
        server = await asyncio.start_server(
            self._connection, host=_HOST, port=self.port, backlog=4096, limit=1 << 20
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        if on_ready is not None:
            on_ready()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await server.wait_closed()

    def shutdown(self) -> None:
        """Stop serving; call from the server's own loop (signal handlers)."""
        if self._stopping is not None:
            self._stopping.set()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._count("connections", +1)
        self._count("connections_accepted", +1)
        try:
            while await self._one_request(reader, writer):
                pass
        except (
            ConnectionError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass  # the client went away mid-request
        except asyncio.CancelledError:
            pass  # the server is stopping
        finally:
            self._count("connections", -1)
            writer.transport.abort()
            self._connections.discard(task)

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; False when the connection is done."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # closed between requests: the normal end of keep-alive
        method, path, headers = _parse_head(head)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            writer.write(
                _response(411, _error_body("openai", 411, "send Content-Length"), close=True)
            )
            return False
        length = int(headers.get("content-length", "0") or "0")
        if length > _MAX_BODY_BYTES:
            writer.write(_response(413, _error_body("openai", 413, "body too large"), close=True))
            return False
        raw = await reader.readexactly(length) if length else b""
        keep_alive = headers.get("connection", "").lower() != "close"
        if method == "GET" and path == "/_stats":
            writer.write(_response(200, json.dumps(self.stats()).encode(), close=not keep_alive))
        elif method == "POST" and path in _ROUTES:
            return await self._llm_request(path, headers, raw, reader, writer) and keep_alive
        else:
            writer.write(_response(404, _error_body("openai", 404, "no such route"), close=True))
            return False
        await writer.drain()
        return keep_alive

    async def _llm_request(
        self,
        path: str,
        headers: dict[str, str],
        raw: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        wire = _ROUTES[path]
        body = _json_or_none(raw)
        fault = self._next_fault()
        auth_present, auth_valid = self._check_auth(headers)
        self._record(path, headers, raw, body, wire, fault, auth_present, auth_valid)
        self._count("in_flight", +1)
        try:
            await self._through_gate()
            if fault.hang:
                await self._until_client_leaves(reader)
                return False
            await self._sleep(self.latency_s if fault.latency_s is None else fault.latency_s)
            if fault.drop:
                return False
            status, payload, extra = self._answer(wire, headers, body, fault, auth_valid)
            if status == 200 and fault.body is None and _wants_stream(body):
                await _write_stream(writer, _stream_pieces(wire, json.loads(payload)), extra)
                return True
            writer.write(_response(status, payload, extra=extra))
            await writer.drain()
            return True
        finally:
            self._count("in_flight", -1)

    def _answer(
        self,
        wire: str,
        headers: dict[str, str],
        body: Any,
        fault: Fault,
        auth_valid: bool | None,
    ) -> tuple[int, bytes, dict[str, str]]:
        if auth_valid is False:
            shown = _presented_key(headers) if self._echo_key else "***"
            return 401, _error_body(wire, 401, f"Incorrect API key provided: {shown}"), {}
        if fault.status != 200:
            extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            return fault.status, _error_body(wire, fault.status, "injected fault"), extra
        if fault.body is not None:
            return 200, fault.body, {}
        problems = _schema_errors(wire, headers, body)
        if problems:
            return 400, _error_body(wire, 400, "; ".join(problems)), {}
        return 200, _success_body(wire, body, fault), {}

    def _check_auth(self, headers: dict[str, str]) -> tuple[bool, bool | None]:
        presented = _presented_key(headers)
        if self._expected_key is None:
            return presented is not None, None
        return presented is not None, presented == self._expected_key

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self._stopping is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _through_gate(self) -> None:
        assert self._gate is not None and self._stopping is not None
        if not self._gate.is_set():
            await _first_of(self._gate.wait(), self._stopping.wait())

    async def _until_client_leaves(self, reader: asyncio.StreamReader) -> None:
        assert self._stopping is not None
        await _first_of(self._stopping.wait(), reader.read(1))  # read: b"" once the client closes

    # --- bookkeeping ----------------------------------------------------------------------

    def _next_fault(self) -> Fault:
        with self._lock:
            return self._faults.popleft() if self._faults else self._default

    def _record(
        self,
        path: str,
        headers: dict[str, str],
        raw: bytes,
        body: Any,
        wire: str,
        fault: Fault,
        auth_present: bool,
        auth_valid: bool | None,
    ) -> None:
        shown = {k: "[redacted]" if _SECRET_HEADER.search(k) else v for k, v in headers.items()}
        record = RecordedRequest(
            "POST", path, shown, auth_present, auth_valid, body, wire, fault, raw_body=raw
        )
        with self._lock:
            self._requests.append(record)
            self._stats["requests"] += 1

    def _count(self, name: str, delta: int) -> None:
        with self._lock:
            self._stats[name] += delta
            peak = name + "_peak"
            if peak in self._stats:
                self._stats[peak] = max(self._stats[peak], self._stats[name])


async def _first_of(*awaitables: Awaitable[Any]) -> None:
    """Until the first of ``awaitables`` is done; the others are cancelled (and awaited)."""
    waiters = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


# --- HTTP and wire formats -----------------------------------------------------------------


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise ConnectionError("bad request line")  # ends the connection
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1].split("?", 1)[0], headers


def _wants_stream(body: Any) -> bool:
    return isinstance(body, dict) and body.get("stream") is True


async def _write_stream(
    writer: asyncio.StreamWriter, pieces: list[bytes], extra: dict[str, str]
) -> None:
    """A streamed answer (``"stream": true``): Server-Sent Events, written piece by piece."""
    total = b"".join(pieces)
    head = _response(200, total, extra=extra, content_type="text/event-stream")
    writer.write(head[: len(head) - len(total)])
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0.002)


def _sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


def _stream_pieces(wire: str, answer: dict[str, Any]) -> list[bytes]:
    """The answer as the provider streams it: OpenAI ``chat.completion.chunk`` lines and
    ``[DONE]``, or Anthropic's ``message_start`` .. ``message_stop`` events."""
    if wire == "anthropic":
        text = "".join(b.get("text", "") for b in answer["content"])
        parts = _parts(text)
        start = answer | {"content": [], "stop_reason": None}
        start["usage"] = answer["usage"] | {"output_tokens": 0}
        out = [_sse({"type": "message_start", "message": start}, "message_start")]
        block = {"type": "text", "text": ""}
        begin = {"type": "content_block_start", "index": 0, "content_block": block}
        out.append(_sse(begin, "content_block_start"))
        for part in parts:
            delta = {"type": "text_delta", "text": part}
            out.append(
                _sse(
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                    "content_block_delta",
                )
            )
        out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        end = {"stop_reason": answer["stop_reason"], "stop_sequence": None}
        usage = {"output_tokens": answer["usage"]["output_tokens"]}
        out.append(_sse({"type": "message_delta", "delta": end, "usage": usage}, "message_delta"))
        out.append(_sse({"type": "message_stop"}, "message_stop"))
        return out
    choice = answer["choices"][0]
    base = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse(base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": part}) for part in _parts(choice["message"]["content"])]
    out.append(chunk({}, choice["finish_reason"]))
    out.append(_sse("[DONE]"))
    return out


def _parts(text: str, count: int = 4) -> list[str]:
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _response(
    status: int,
    body: bytes,
    *,
    extra: dict[str, str] | None = None,
    close: bool = False,
    content_type: str = "application/json",
) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close" if close else "Connection: keep-alive",
        *(f"{k}: {v}" for k, v in (extra or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def _presented_key(headers: dict[str, str]) -> str | None:
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None


def _schema_errors(wire: str, headers: dict[str, str], body: Any) -> list[str]:
    if wire == "openai":
        return openai_chat_errors(body)
    problems = anthropic_messages_errors(body)
    if "anthropic-version" not in headers:
        problems.append("the anthropic-version header is required")
    return problems


def _error_body(wire: str, status: int, message: str) -> bytes:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if wire == "anthropic":
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    error = {"message": message, "type": kind, "param": None, "code": None}
    return json.dumps({"error": error}).encode()


def _success_body(wire: str, body: dict[str, Any], fault: Fault) -> bytes:
    max_tokens = _max_tokens(body) or 256
    if fault.empty:
        text = ""
    elif fault.text is not None:
        text = fault.text
    else:
        text = standin_summary(_user_text(body), max_tokens, overlong=fault.overlong)
    stop = "length" if fault.overlong else "stop"
    usage_in, usage_out = len(_user_text(body)) // 4, len(text) // 4
    if wire == "anthropic":
        answer: dict[str, Any] = {
            "id": f"msg_standin_{_digest(text)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": "max_tokens" if fault.overlong else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage_in, "output_tokens": usage_out},
        }
    else:
        answer = {
            "id": f"chatcmpl-standin-{_digest(text)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": stop,
                }
            ],
            "usage": {
                "prompt_tokens": usage_in,
                "completion_tokens": usage_out,
                "total_tokens": usage_in + usage_out,
            },
        }
    return json.dumps(answer).encode()


def standin_summary(user_text: str, max_tokens: int, *, overlong: bool = False) -> str:
    """The deterministic answer: the terms found in the request, in order, and its digest.

    Within ``max_tokens`` (at about two characters a token) it keeps the newest terms, as a
    continuity summary should when it must choose.
    """
    terms = list(dict.fromkeys(_TERM.findall(user_text)))
    head = [
        "## Goal",
        f"Continue ({len(user_text)} chars in, digest {_digest(user_text)}).",
        "## Artifacts and files touched",
    ]
    tail = ["## Next steps", "- continue"]
    if overlong:
        lines = [*head, *(f"- `{t}`" for t in terms), *tail]
        return "\n".join(lines) + "\n" + " ".join(f"filler{i}" for i in range(max_tokens * 3))
    room = max_tokens * 2 - len("\n".join([*head, *tail])) - 1
    kept: list[str] = []
    for term in reversed(terms):
        room -= len(term) + 5
        if room < 0:
            break
        kept.insert(0, f"- `{term}`")
    return "\n".join([*head, *(kept or ["none"]), *tail])[: max(max_tokens * 2, 1)]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _user_text(body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def _system_text(body: Any, wire: str | None) -> str:
    if not isinstance(body, dict):
        return ""
    if wire == "anthropic":
        return _content_text(body.get("system"))
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            return _content_text(message.get("content"))
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def _max_tokens(body: Any) -> int | None:
    if not isinstance(body, dict):
        return None
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


# --- command line --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.testing.standin_llm",
        description="A stand-in LLM provider (OpenAI and Anthropic wire formats) on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--latency-s", type=float, default=0.0, help="delay before each answer")
    args = parser.parse_args(argv)
    server = StandinLLM(port=args.port, latency_s=args.latency_s)
    asyncio.run(_run_forever(server))
    return 0


async def _run_forever(server: StandinLLM) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.shutdown)

    def announce() -> None:
        print(f"standin-llm listening on {server.url}", flush=True)

    await server.serve(on_ready=announce)


if __name__ == "__main__":
    sys.exit(main())
