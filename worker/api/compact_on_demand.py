"""Compaction on demand over HTTP: ``POST /v1/conversations/{id}/compact``.

The body (optional; empty means ``{}``) is ``{"instructions": "...", "config": {...},
"tools": {...}}``: the focus of the summary (at most 2,000 characters; only its SHA-256 reaches
the event) and overrides of what to keep, as a snapshot's. The conversation's newest snapshot is
compacted whatever the threshold says, by any worker (:meth:`worker.client.Client.compact_now`).
Answers 202 with the request id and what to wait for; 404 for a conversation the tenant does not
have, 409 when it has no snapshot to compact, 422 naming the field of a bad body.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.api.common import NOT_FOUND, ApiError, json_body, known_id
from worker.api.state import api_of
from worker.errors import InvalidRequest, NoSnapshot

_FIELDS = frozenset({"instructions", "config", "tools"})


def request_fields(doc: Any) -> dict[str, Any]:
    """The body's fields, checked strictly (the values are checked by the client)."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ApiError(422, InvalidRequest("", "the body must be a JSON object").to_dict())
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise ApiError(
            422,
            InvalidRequest(
                unknown[0], "unknown field (instructions, config and tools are known)"
            ).to_dict(),
        )
    return dict(doc)


async def compact_conversation(request: Request) -> Response:
    api = api_of(request)
    tenant = api.tenant(request)
    internal = known_id(tenant, request)
    body = await api.body(request)
    fields = request_fields(json_body(body, api.body_limit) if body.strip() else None)
    if not await api.known(internal):
        raise ApiError.of(404, "not_found", NOT_FOUND)
    try:
        result = await anyio.to_thread.run_sync(
            lambda: api.client.compact_now(
                internal,
                fields.get("instructions"),
                config=fields.get("config"),
                tools=fields.get("tools"),
            )
        )
    except InvalidRequest as exc:
        raise ApiError(422, exc.to_dict()) from None
    except NoSnapshot:
        raise ApiError.of(
            409,
            "no_snapshot",
            "the conversation has no snapshot to compact (its newest expired): submit one",
        ) from None
    external = tenant.external(internal)
    return JSONResponse(
        {
            "status": "requested",
            "request_id": result.request_id,
            "revision": result.revision,
            "replaced": result.replaced,
            "events": f"/v1/conversations/{external}/events",
            "wait_for": {
                "trigger.kind": "requested",
                "trigger.request_id": result.request_id,
            },
        },
        status_code=202,
    )
