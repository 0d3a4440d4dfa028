"""What the routes share: the error answer, bounded bodies, parameters checked before use,
and redis.asyncio errors converted into the error tree."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio
from starlette.requests import Request

from worker.api.auth import Tenant
from worker.errors import (
    ConfigError,
    InvalidSnapshot,
    RedisUnavailable,
)
from worker.wire.snapshots import decode_json

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


@contextlib.contextmanager
def aredis_errors(action: str) -> Any:
    """redis.asyncio errors into the error tree (as worker.backend.connection does for the sync
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


def json_body(data: bytes, limit: int) -> Any:
    try:
        return decode_json(data, max_bytes=limit)
    except InvalidSnapshot as exc:
        raise ApiError(400, exc.to_dict()) from None


def known_id(tenant: Tenant, request: Request) -> str:
    try:
        return tenant.internal(request.path_params["conversation_id"])
    except InvalidSnapshot as exc:
        raise ApiError(422, exc.to_dict()) from None


def after_param(request: Request) -> str:
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


def integer_param(raw: str, name: str, low: int, high: int) -> int:
    if _DIGITS.fullmatch(raw) and low <= int(raw) <= high:
        return int(raw)
    raise ApiError.of(
        422, "invalid_request", f"{name}: an integer from {low} to {high} (ASCII digits)"
    )


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    return default if raw is None else integer_param(raw, name, low, high)


def external_events(
    entries: list[tuple[str, dict[str, Any] | None]], tenant: Tenant
) -> list[dict[str, Any]]:
    """Stream entries (:func:`worker.backend.streams.stream_entries`) as the tenant sees them
    (:meth:`Tenant.event`); an entry that holds no JSON event is left out (it was warned
    about)."""
    return [tenant.event(doc) | {"stream_id": sid} for sid, doc in entries if doc is not None]
