"""``compactor mcp``'s way to the service: the ``/v1`` routes of ``compactor serve`` over HTTP
(httpx), with one tenant's API key, so the MCP server runs wherever the agent host does (a
laptop) and the service wherever it is deployed.

An error answer becomes :class:`ServiceError` here, once: the API's code and message (its
``field`` and ``reason`` for a refused argument), or, when the service cannot be reached, the
URL it was looked for at (credentials masked). The key is sent in the ``Authorization`` header
and never put into an error, a log line or an answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import quote

import anyio
import httpx

from worker.config import mask_url
from worker.errors import CompactorError

TIMEOUT_S = 30.0  # one request's connect, read and write timeouts
EVENTS_PER_PAGE = 1000  # the events route's largest page
MAX_EVENT_PAGES = 50  # a stream longer than this many pages is read only so far
RECONNECT_S = 1.0  # before following the events again after a dropped stream

# (stream id, event document)
Entry = tuple[str, dict[str, Any]]


class ServiceError(CompactorError):
    """An answer of the service that is an error, or no answer at all (``status`` 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message, code=code)
        self.status = status


class Service:
    """The ``/v1`` routes ``compactor mcp`` uses, for the tenant ``api_key`` names (None: a
    ``compactor serve --no-auth``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = mask_url(base_url) or base_url
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=TIMEOUT_S,
            transport=transport,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def events(self, conversation_id: str) -> list[Entry]:
        """The conversation's events, oldest first, each with its ``stream_id``."""
        out: list[Entry] = []
        after = "0"
        for _ in range(MAX_EVENT_PAGES):
            page = await self._json(
                "GET",
                f"{_conversation(conversation_id)}/events",
                params={"after": after, "limit": EVENTS_PER_PAGE},
            )
            if not isinstance(page, list):
                raise _unexpected(200, "the events route")
            out += [(str(doc["stream_id"]), doc) for doc in page if _has_stream_id(doc)]
            if len(page) < EVENTS_PER_PAGE or not out:
                break
            after = out[-1][0]
        return out

    async def recall(self, conversation_id: str, message_id: str) -> dict[str, Any]:
        path = f"{_conversation(conversation_id)}/messages/{quote(message_id, safe='')}"
        return _object(await self._json("GET", path), "the recall route")

    async def transcript(self, conversation_id: str, revision: int) -> dict[str, Any]:
        path = f"{_conversation(conversation_id)}/transcripts/{revision}"
        return _object(await self._json("GET", path), "the transcript route")

    async def compact(self, conversation_id: str, instructions: str | None) -> dict[str, Any]:
        body = {} if instructions is None else {"instructions": instructions}
        answer = await self._json("POST", f"{_conversation(conversation_id)}/compact", json=body)
        return _object(answer, "the compact route")

    async def readiness(self) -> dict[str, Any]:
        """``/readyz``'s document, ready (200) or not (503)."""
        try:
            response = await self._http.get("/readyz")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code not in (200, 503):
            raise _error(response)
        return _object(_decoded(response), "/readyz")

    async def wait_for(
        self,
        conversation_id: str,
        after: str,
        matches: Callable[[dict[str, Any]], bool],
        timeout_s: float,
    ) -> dict[str, Any] | None:
        """The first event after stream id ``after`` that ``matches``, followed live (the
        events route's SSE stream, resumed after the last event seen when it drops); None when
        none came within ``timeout_s``."""
        with anyio.move_on_after(timeout_s):
            while True:
                try:
                    async for stream_id, doc in self._follow(conversation_id, after):
                        after = stream_id
                        if matches(doc):
                            return doc
                except httpx.TransportError:
                    pass
                await anyio.sleep(RECONNECT_S)
        return None

    async def _follow(self, conversation_id: str, after: str) -> AsyncIterator[Entry]:
        path = f"{_conversation(conversation_id)}/events"
        async with self._http.stream(
            "GET",
            path,
            params={"after": after},
            headers={"Accept": "text/event-stream"},
            timeout=httpx.Timeout(TIMEOUT_S, read=None),  # idle between events: keep-alives
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise _error(response)
            async for entry in sse_entries(response.aiter_lines()):
                yield entry

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code >= 400:
            raise _error(response)
        return _decoded(response)

    def _unreachable(self, exc: httpx.HTTPError) -> ServiceError:
        return ServiceError(
            0,
            "service_unavailable",
            f"compactor serve at {self.url} cannot be reached ({type(exc).__name__}); is it "
            "running, and is --url (COMPACTOR_URL) its address?",
        )


async def sse_entries(lines: AsyncIterator[str]) -> AsyncIterator[Entry]:
    """Server-Sent Events as (id, the JSON of its data): comments, ``retry:`` and events
    without data are passed over."""
    event_id, data = "", list[str]()
    async for line in lines:
        if line == "":
            doc = _json_or_none("\n".join(data)) if data and event_id else None
            if isinstance(doc, dict):
                yield event_id, doc
            event_id, data = "", list[str]()
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:  # not an event: passed over, as every reader of the stream does
        return None


def _conversation(conversation_id: str) -> str:
    return f"/v1/conversations/{quote(conversation_id, safe='')}"


def _has_stream_id(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("stream_id"), str)


def _decoded(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise _unexpected(response.status_code, str(response.request.url.path)) from None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _unexpected(200, what)
    return value


def _unexpected(status: int, what: str) -> ServiceError:
    return ServiceError(status, "unexpected_answer", f"{what} answered with no JSON object")


def _error(response: httpx.Response) -> ServiceError:
    """The API's error answer (``{"error", "message"}``, or ``field`` and ``reason``)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, Mapping) or not isinstance(body.get("error"), str):
        return ServiceError(
            response.status_code,
            f"http_{response.status_code}",
            f"the service answered {response.status_code} without a JSON error",
        )
    message = body.get("message")
    if not isinstance(message, str):
        message = f"{body.get('field', '')}: {body.get('reason', '')}".strip(": ")
    return ServiceError(response.status_code, body["error"], message)
