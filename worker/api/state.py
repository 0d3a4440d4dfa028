"""The state one ``compactor serve`` process shares between its requests."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from typing import Any

import anyio.to_thread
from starlette.requests import Request

from worker.api.auth import ApiKeys, Tenant, bearer, load_api_keys
from worker.api.common import ApiError, aredis_errors, read_body
from worker.backend import keys
from worker.backend.redis_state import (
    connect_async,
    state_url,
)
from worker.client import Client
from worker.config import Settings
from worker.wire.events import CompletedEvent, parse_event


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
        with aredis_errors("checking the conversation"):
            return bool(await self.aredis.exists(keys.events(internal), keys.latest(internal)))

    async def completed_events(self, internal: str) -> list[tuple[str, CompletedEvent]]:
        """The conversation's completed events in its stream, newest first."""
        with aredis_errors("reading events"):
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


def api_of(request: Request) -> Api:
    api: Api = request.app.state.api
    return api
