"""A conversation's events as a live Server-Sent Events stream: ``/v1``'s events route and the
inspector's live updates."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio
from starlette.responses import StreamingResponse

from worker.api.auth import Tenant
from worker.api.common import external_events
from worker.api.state import Api
from worker.backend.streams import anewest_id, await_entries, stream_entries

log = logging.getLogger(__name__)


async def sse_events(api: Api, stream: str, tenant: Tenant, after: str) -> AsyncIterator[bytes]:
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
        for doc in external_events(entries, tenant):
            data = json.dumps(doc, ensure_ascii=False)
            out.append(f"id: {doc['stream_id']}\ndata: {data}\n\n".encode())
        if out:
            yield b"".join(out)


def sse_response(api: Api, stream: str, tenant: Tenant, after: str) -> StreamingResponse:
    """The stream of :func:`sse_events` as a response, never cached or buffered by a proxy."""
    return StreamingResponse(
        sse_events(api, stream, tenant, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
