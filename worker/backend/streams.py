"""Reading event streams: blocking reads in slices that each answer within the connections'
read timeout, and stream entries decoded into events, tolerantly (a damaged entry is skipped
with a warning, never stops a reader)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

#: The longest ``BLOCK`` of one XREAD/XREADGROUP: its reply is due by then, well within the
#: connections' read timeout (:data:`worker.backend.connection.READ_TIMEOUT_S`). A longer wait
#: is several such reads (:func:`block_slices`): a follower waits as long as it was told, and
#: every connection keeps its read timeout.
BLOCK_SLICE_MS = 5000


def block_slices(block_ms: int) -> Iterator[int]:
    """The ``BLOCK`` of each read that together wait ``block_ms`` (0: without end, as Redis
    means it), each at most :data:`BLOCK_SLICE_MS`. Never 0 itself, which would block forever."""
    if block_ms < 0:
        raise ValueError(f"block_ms must be 0 (no end) or more, not {block_ms}")
    if block_ms == 0:
        while True:
            yield BLOCK_SLICE_MS
    deadline = time.monotonic() + block_ms / 1000
    left = block_ms
    while left > 0:
        yield min(left, BLOCK_SLICE_MS)
        left = int((deadline - time.monotonic()) * 1000)


async def await_entries(read: Callable[[int], Awaitable[Any]], block_ms: int) -> Any:
    """The first reply with entries of ``read(block)`` (an XREAD or XREADGROUP with that
    ``BLOCK``), called over :func:`block_slices` of ``block_ms``; None once the wait is over.

    The caller's stream ids must be fixed ones (or ``>``), never ``$``: each slice would take
    ``$`` afresh and miss what arrived in between (:func:`anewest_id` fixes it)."""
    task = asyncio.current_task()
    for block in block_slices(block_ms):
        reply = await read(block)
        if reply:
            return reply
        if task is not None and task.cancelling():
            # A cancellation that landed inside redis-py's read (its own asyncio.timeout) can
            # be swallowed there (seen on Python 3.11 under load): honour it between slices.
            raise asyncio.CancelledError
    return None


async def anewest_id(client: Any, stream: str) -> str:
    """:meth:`worker.backend.redis_state.RedisState.newest_id` on an asyncio client."""
    return newest_id_of(await client.xrevrange(stream, count=1))


def newest_id_of(entries: list[Any]) -> str:
    """The id of the newest of XREVRANGE's ``entries`` (``0-0`` for none)."""
    return as_text(entries[0][0]) if entries else "0-0"


def stream_entries(reply: Any, stream: str) -> list[tuple[str, dict[str, Any] | None]]:
    """The entries of an XREAD/XREADGROUP reply as (entry id, event), oldest first; the event
    is None, after a warning, for an entry that holds no JSON object (a reader moves past it
    instead of stopping on it)."""
    return [
        (as_text(entry_id), entry_event(entry_id, fields, stream))
        for _stream, entries in reply or []
        for entry_id, fields in entries
    ]


def entry_event(entry_id: Any, fields: Any, stream: str) -> dict[str, Any] | None:
    """The ``event`` field of a stream entry as a JSON object, or None (with a warning)."""
    raw = fields.get(b"event") if isinstance(fields, dict) else None
    try:
        doc = json.loads(raw) if raw is not None else None
    except ValueError:  # not JSON, or not UTF-8
        doc = None
    if isinstance(doc, dict):
        return doc
    log.warning("skipping entry %s of %s: not a JSON event", as_text(entry_id), stream)
    return None


def as_text(value: Any) -> str:
    """A reply's bytes (or number) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
