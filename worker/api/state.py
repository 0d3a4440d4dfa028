"""The state one ``compactor serve`` process shares between its requests."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import anyio.to_thread
from starlette.requests import Request

from worker.api.auth import ApiKeys, Tenant, bearer, load_api_keys
from worker.api.common import MAX_MESSAGE_ID, ApiError, aredis_errors, read_body
from worker.api.review import Reviewer
from worker.backend import keys
from worker.backend.connection import connect_async, state_url
from worker.client import Client
from worker.config import Settings
from worker.errors import InvalidSnapshot, StorageError
from worker.wire import formats
from worker.wire.events import CompletedEvent, RevertedEvent, parse_event

log = logging.getLogger(__name__)


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
        # Approving and declining held compactions (review before apply).
        self.reviewer = Reviewer(self.client.state, self.transcripts, settings)
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
        with aredis_errors("checking the conversation"):
            return bool(await self.aredis.exists(keys.events(internal), keys.latest(internal)))

    async def completed_events(self, internal: str) -> list[tuple[str, CompletedEvent]]:
        """The conversation's completed events in its stream, newest first, without those
        restored since (a ``compaction.reverted`` names them)."""
        with aredis_errors("reading events"):
            entries = await self.aredis.xrevrange(
                keys.events(internal), count=self.settings.redis.stream_maxlen
            )
        out = []
        reverted: set[str] = set()
        for entry_id, fields in entries:
            # An entry that is no event (written by another program, cut short) is skipped,
            # as every other reader of the stream skips it.
            with contextlib.suppress(ValueError, KeyError):
                event = parse_event(fields[b"event"])
                if isinstance(event, RevertedEvent):
                    reverted.add(event.reverted_event_id)  # newest first: before its compaction
                elif isinstance(event, CompletedEvent) and event.event_id not in reverted:
                    out.append((entry_id.decode(), event))
        return out

    async def recall(self, internal: str, message_id: str) -> dict[str, Any]:
        """The original of message ``message_id`` as the newest kept compaction that replaced
        it keeps it (its transcript checked against the event's sha256), with where it came
        from. 422 for an id over :data:`MAX_MESSAGE_ID` characters, 410 ``expired`` when the
        compaction that replaced it (as far as its event records) keeps no transcript any more
        (retention removed it), 404 when no kept compaction replaced it."""
        if len(message_id) > MAX_MESSAGE_ID:
            raise ApiError.of(
                422, "invalid_request", f"message_id: at most {MAX_MESSAGE_ID} characters"
            )
        gone = 0
        for stream_id, event in await self.completed_events(internal):
            ref = event.compaction.transcript
            if ref is None:
                continue
            try:
                data = await anyio.to_thread.run_sync(self.transcripts.read, ref.uri)
            except (StorageError, InvalidSnapshot):
                if event.compaction.names(message_id):  # pruned meanwhile: say so
                    raise ApiError.of(
                        410,
                        "expired",
                        f"message {message_id!r} was compacted, and the transcript that kept "
                        "its original has since been removed by transcript retention",
                    ) from None
                gone += 1
                continue
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
                return {
                    "conversation_id": event.conversation_id,
                    "message_id": message_id,
                    "message": messages[ids.index(message_id, start)],
                    "revision": event.revision,
                    "event_id": event.event_id,
                    "stream_id": stream_id,
                    "transcript_sha256": ref.sha256,
                }
        note = f" ({gone} earlier compactions' transcripts have expired)" if gone else ""
        raise ApiError.of(
            404, "not_found", f"no kept compaction replaced message {message_id!r}{note}"
        )


def api_of(request: Request) -> Api:
    api: Api = request.app.state.api
    return api
