"""The Redis adapter: claim-checked snapshots, coalescing, the single-flight lock, events.

Every redis-py exception is converted here, once, into :class:`TransientError` (Redis may come
back) so task retries key on our own error tree. The multi-step updates that must be atomic are
Lua scripts: a submission records its payload and the conversation's newest revision together;
publishing checks the fencing token, de-duplicates by event id and appends to the stream in one
step, so a worker that lost its lease can never publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from worker.backend import keys
from worker.backend.redis_target import DEFAULT_REDIS_URL, RedisTarget, parse_redis_url
from worker.config import RedisConfig, Settings, redis_url
from worker.core.cost import Activity
from worker.errors import (
    ConfigError,
    LeaseLost,
    NoSnapshot,
    RedisUnavailable,
    TransientError,
)
from worker.wire.composed import (
    ComposedCompaction,
    HeldProposal,
    approved_composition,
    without,
)
from worker.wire.events import (
    CompactionEvent,
    CompletedEvent,
    DeclinedEvent,
    RevertedEvent,
    Summary,
    approved_event,
    declined_event,
    parse_event,
    reverted_event,
)
from worker.wire.requests import CompactRequest

log = logging.getLogger(__name__)

_T = TypeVar("_T")

RECENT_MAXLEN = 1000
IDLE_INDEX_MAX = 100_000  # conversations kept in a tenant's idle index (the newest by submit)
# Idle compactions one tenant may have handed out and not finished: what one idle scan hands a
# tenant at most, and so what another tenant's idle compaction can find queued ahead of it.
IDLE_PER_TENANT = 100
IDLE_SCAN_TENANTS = 1_000  # tenants one idle scan looks at, those waiting longest first
_IDLE_TENANTS_PER_CALL = 100  # tenants per call of the take script: each call blocks Redis
NO_TENANT = "-"  # the idle index's tenant of an id without a tenant prefix
TENANT_INDEX_MAX = 10_000  # conversations kept in a tenant's index (the newest by activity)
LAST_COMPACTIONS = 8  # completed compactions kept to re-apply to snapshots taken before them


# Raised by the cluster client while slots move or a master fails over (its own retries spent):
# like a connection error, the cluster may be whole again in a moment.
_CLUSTER_TRANSIENT = (
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # MovedError too: a storm of redirections outlasted the retries
    redis.exceptions.ClusterError,
    redis.exceptions.SlotNotCoveredError,  # a master is down: its slots have no node now
)


@contextlib.contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Convert redis-py errors into TransientError (the one place they are converted)."""
    try:
        yield
    except redis.exceptions.NoScriptError:
        raise
    except redis.exceptions.AuthenticationError:
        raise ConfigError(
            "redis.url",
            "Redis refused the credentials (check the password or ACL user in COMPACTOR_REDIS_URL)",
        ) from None
    except (
        redis.exceptions.ConnectionError,  # also Sentinel's MasterNotFoundError
        redis.exceptions.TimeoutError,
        redis.exceptions.BusyLoadingError,
        redis.exceptions.ReadOnlyError,
        *_CLUSTER_TRANSIENT,
    ) as exc:
        raise RedisUnavailable(f"redis unavailable while {action}: {type(exc).__name__}") from None
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        # RedisClusterException is no RedisError; its other kinds (keys of two slots in one
        # command) are bugs, reported as such.
        raise RedisUnavailable(f"redis error while {action}: {exc}", code="redis_error") from None


def state_url(settings: Settings) -> str:
    """Where the state lives: ``[redis] url`` (``COMPACTOR_REDIS_URL``), else a local Redis."""
    return redis_url(settings) or DEFAULT_REDIS_URL


class TransientRetry(Retry):
    """redis-py's :class:`Retry`, except that refused credentials are not retried.

    ``AuthenticationError`` is a ``ConnectionError`` to redis-py, so the plain policy would back
    off for ~5 s before saying the password is wrong; a wrong password is not transient.
    """

    def call_with_retry(
        self,
        do: Callable[[], _T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> _T:
        def transient(error: Exception) -> bool:
            if isinstance(error, redis.exceptions.AuthenticationError):
                return False
            return is_retryable is None or is_retryable(error)

        return super().call_with_retry(do, fail, transient, with_failure_count)


def _retry() -> Retry:
    return TransientRetry(ExponentialBackoff(cap=2.0, base=0.1), retries=5)


def _tls(target: RedisTarget) -> dict[str, Any]:
    """TLS to the Sentinels themselves (``rediss+sentinel://``); the master's is in auth()."""
    return {"ssl": True} if target.tls else {}


_sync_cluster: Any = redis.cluster  # partly unannotated
_sync_sentinel: Any = redis.sentinel
_async_sentinel: Any = redis.asyncio.sentinel
_RETRY_ON = [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]

#: How long any reply may take before its connection is given up for dead: every client's
#: socket timeout, set explicitly on every kind of client (redis-py's own default is no
#: timeout before 8.0 and 5 s from 8.0, and differs between its clients).
READ_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
HEALTH_CHECK_S = 15
#: The longest ``BLOCK`` of one XREAD/XREADGROUP: its reply is due by then, well within
#: ``READ_TIMEOUT_S``. A longer wait is several such reads (:func:`block_slices`): a follower
#: waits as long as it was told, and every connection keeps its read timeout.
BLOCK_SLICE_MS = 5000


def connect(url: str) -> Any:
    """A client for any form of ``[redis] url``
    (:func:`worker.backend.redis_target.parse_redis_url`): a standalone Redis, a Redis Cluster
    or the master a Sentinel names. Each retries a few times with backoff on connection errors
    (restarts, failovers)."""
    target = parse_redis_url(url)
    common: dict[str, Any] = {
        "socket_timeout": READ_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_S,
        "retry": _retry(),
    }
    if target.kind == "standalone":
        return redis.Redis.from_url(url, retry_on_error=_RETRY_ON, **common)
    if target.kind == "cluster":
        return _PatientCluster(
            startup_nodes=[_sync_cluster.ClusterNode(h, p) for h, p in target.nodes],
            **target.auth(),
            **common,
        )
    sentinel = _sync_sentinel.Sentinel(target.nodes, sentinel_kwargs=_sentinel_kwargs(target))
    return sentinel.master_for(
        target.service, db=target.db, retry_on_error=_RETRY_ON, **target.auth(), **common
    )


def _sentinel_kwargs(target: RedisTarget) -> dict[str, Any]:
    """How to talk to the Sentinels themselves (the master's connections are configured apart)."""
    return {
        "socket_timeout": READ_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        **_tls(target),
    }


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


#: Pauses between the cluster client's attempts while no node answers (about 9 s in all): its
#: own retries come back at once, so a restart of the cluster's masters would fail a command
#: that the standalone client (Retry with backoff) rides out.
CLUSTER_BACKOFF_S = (0.1, 0.2, 0.4, 0.8, 1.5, 2.0, 2.0, 2.0)


def _cluster_unreachable(exc: Exception) -> bool:
    """No node answered (the client could not even learn the slots), or one refused."""
    if isinstance(exc, redis.exceptions.RedisClusterException):
        return "cannot be connected" in str(exc)  # redis-py raises its base class for it
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return False  # a ConnectionError to redis-py, but a wrong password stays wrong
    return isinstance(exc, (*_RETRY_ON, redis.exceptions.ClusterDownError))


class _PatientCluster(redis.cluster.RedisCluster):
    """redis-py's cluster client, with backoff between attempts while the cluster is down."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        for pause_s in CLUSTER_BACKOFF_S:
            try:
                return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
                if not _cluster_unreachable(exc):
                    raise
            time.sleep(pause_s)
        return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]


def connect_async(url: str, *, max_connections: int | None = None) -> Any:
    """:func:`connect` for asyncio code (redis-py's asyncio clients), with the same timeouts and
    retries. A blocking read waits longer than ``READ_TIMEOUT_S`` in slices: see
    :func:`await_entries`."""
    target = parse_redis_url(url)
    common: dict[str, Any] = {
        "socket_timeout": READ_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_S,
    }
    if max_connections is not None:
        common["max_connections"] = max_connections
    # Without a retry policy redis-py's asyncio connections try once: the first command on a
    # pooled connection that a Redis restart closed would fail. The cluster client has its own.
    retries: dict[str, Any] = {
        "retry": _AsyncTransientRetry(ExponentialBackoff(cap=2.0, base=0.1), retries=5),
        "retry_on_error": _RETRY_ON,
    }
    if target.kind == "standalone":
        return redis.asyncio.Redis.from_url(url, **retries, **common)
    if target.kind == "cluster":
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in target.nodes],
            **target.auth(),
            **common,
        )
    sentinel = _async_sentinel.Sentinel(target.nodes, sentinel_kwargs=_sentinel_kwargs(target))
    return sentinel.master_for(
        target.service,
        redis_class=_AsyncSentinelMaster,
        db=target.db,
        **target.auth(),
        **retries,
        **common,
    )


class _Refused(Exception):
    """Carries an AuthenticationError past redis-py's retry loop (it is no redis error)."""

    def __init__(self, error: redis.exceptions.AuthenticationError) -> None:
        super().__init__(str(error))
        self.error = error


class _AsyncTransientRetry(redis.asyncio.retry.Retry):
    """:class:`TransientRetry` for the asyncio clients, whose ``Retry`` has no ``is_retryable``
    before redis-py 8.0: a refused password goes past the retry loop, wrapped."""

    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        async def attempt() -> Any:
            try:
                return await do()
            except redis.exceptions.AuthenticationError as exc:
                raise _Refused(exc) from None

        try:
            return await super().call_with_retry(attempt, fail, *args, **kwargs)
        except _Refused as refused:
            raise refused.error from None


class _AsyncSentinelMaster(redis.asyncio.Redis):
    """The master a Sentinel names, whose ``aclose`` closes the connections to the Sentinels
    too (redis-py leaves them open: one per follower that came and went)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            await sentinel.aclose()


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
    """:meth:`RedisState.newest_id` on an asyncio client."""
    return _newest(await client.xrevrange(stream, count=1))


def _newest(entries: list[Any]) -> str:
    return _text(entries[0][0]) if entries else "0-0"


def stream_entries(reply: Any, stream: str) -> list[tuple[str, dict[str, Any] | None]]:
    """The entries of an XREAD/XREADGROUP reply as (entry id, event), oldest first; the event
    is None, after a warning, for an entry that holds no JSON object (a reader moves past it
    instead of stopping on it)."""
    return [
        (_text(entry_id), entry_event(entry_id, fields, stream))
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
    log.warning("skipping entry %s of %s: not a JSON event", _text(entry_id), stream)
    return None


# Every script touches one conversation's keys only, all passed in KEYS and all in the slot of
# the conversation's hash tag (worker.backend.keys): on a Redis Cluster each runs on one node. The
# global keys (cw:pending, cw:recent, cw:metrics) are written around the scripts (keys.py).

_SUBMIT = """
local latest = tonumber(redis.call('GET', KEYS[2]) or '-1')
local handled = tonumber(redis.call('GET', KEYS[4]) or '-1')
local rev = tonumber(ARGV[2])
if rev < latest or rev <= handled then return {'superseded', math.max(latest, handled)} end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
if redis.call('SET', KEYS[3], ARGV[2], 'NX', 'EX', ARGV[3]) then return {'queued', rev} end
return {'coalesced', rev}
"""

# Undoes a 'queued' submit whose task message could not be sent, so that the next submission
# queues afresh rather than coalescing into a task that does not exist. Only if the flag still
# holds that revision: an evaluation may have taken it meanwhile (the reconciler's) and another
# submission set it again. Should that one carry the same revision, it loses its flag while
# its task exists, which costs at most one extra evaluation later: never a flag without a task.
_UNQUEUE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Publishes one or more events of a conversation, in order; the last is the outcome, whose
# handled revision, memo and compaction (or proposal, held for review) are recorded with it, only
# if it is published. KEYS: the stream, lock, handled, last, latest, memo, composed, proposal,
# then each event's published flag. ARGV from 14 on: each event's JSON. Replies {newest, status
# of each event} or {'lease_lost'}.
_PUBLISH = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'lease_lost'} end
local reply = {0}
for i = 14, #ARGV do
  if redis.call('SET', KEYS[i - 5], 1, 'NX', 'EX', ARGV[12]) then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[i])
    redis.call('EXPIRE', KEYS[1], ARGV[3])
    redis.call('PUBLISH', ARGV[5], ARGV[i])
    reply[#reply + 1] = 'published'
  else
    reply[#reply + 1] = 'duplicate'
  end
end
if reply[#reply] ~= 'published' then return reply end
local outcome = ARGV[#ARGV]
if ARGV[2] ~= '' then
  local handled = tonumber(redis.call('GET', KEYS[3]) or '-1')
  if tonumber(ARGV[2]) > handled then redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3]) end
  local latest = tonumber(redis.call('GET', KEYS[5]) or '-1')
  if tonumber(ARGV[2]) >= latest then reply[1] = 1 end
end
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[6], 'd', ARGV[10], 'b', ARGV[8])
  redis.call('EXPIRE', KEYS[6], ARGV[9])
end
if ARGV[6] == '1' then
  redis.call('LPUSH', KEYS[4], outcome)
  redis.call('LTRIM', KEYS[4], 0, ARGV[7] - 1)
  redis.call('EXPIRE', KEYS[4], ARGV[3])
  if ARGV[11] ~= '' then redis.call('SET', KEYS[7], ARGV[11], 'EX', ARGV[3]) end
end
if ARGV[13] ~= '' then redis.call('SET', KEYS[8], ARGV[13], 'EX', ARGV[3]) end
return reply
"""

# Approve the held compaction: only if it is still the one held (ARGV[1]) and the composition
# is still the one it was computed on (its newest compaction's id, ARGV[2]; '' for none). Then,
# as a publish of a completed event does: the proposal goes, the event enters 'last', the
# stream and the composition. KEYS: proposal, last, composed, events, the published flag.
_APPROVE = """
local held = redis.call('GET', KEYS[1])
if not held or cjson.decode(held)['event']['event_id'] ~= ARGV[1] then return {'not_held', ''} end
local composed = redis.call('GET', KEYS[3])
local base = ''
if composed then base = cjson.decode(composed)['event_id'] or '' end
if base ~= ARGV[2] then return {'changed', ''} end
if not redis.call('SET', KEYS[5], 1, 'NX', 'EX', ARGV[6]) then return {'duplicate', ''} end
redis.call('DEL', KEYS[1])
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, ARGV[8] - 1)
redis.call('EXPIRE', KEYS[2], ARGV[6])
if ARGV[4] ~= '' then redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[6]) end
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'event', ARGV[3])
redis.call('EXPIRE', KEYS[4], ARGV[6])
redis.call('PUBLISH', ARGV[7], ARGV[3])
return {'approved', id}
"""

# Decline the held compaction ARGV[1]: the proposal goes and the declined event is published.
# KEYS: proposal, events, the published flag.
_DECLINE = """
local held = redis.call('GET', KEYS[1])
if not held or cjson.decode(held)['event']['event_id'] ~= ARGV[1] then return {'not_held', ''} end
if not redis.call('SET', KEYS[3], 1, 'NX', 'EX', ARGV[4]) then return {'duplicate', ''} end
redis.call('DEL', KEYS[1])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[2])
return {'declined', id}
"""

# Restore (undo) the newest completed compaction: only while no worker holds the conversation
# (it may be publishing one computed on it), only if it is still the newest, and only if the
# composition is still the one the new one was computed from.
_REVERT = """
if redis.call('EXISTS', KEYS[3]) == 1 then return {'busy', ''} end
local head = redis.call('LINDEX', KEYS[1], 0)
if not head or cjson.decode(head)['event_id'] ~= ARGV[1] then return {'not_newest', ''} end
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[2] then return {'changed', ''} end
if not redis.call('SET', KEYS[5], 1, 'NX', 'EX', ARGV[6]) then return {'duplicate', ''} end
redis.call('LPOP', KEYS[1])
if ARGV[3] == '' then redis.call('DEL', KEYS[2])
else redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[6]) end
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'event', ARGV[4])
redis.call('EXPIRE', KEYS[4], ARGV[6])
redis.call('PUBLISH', ARGV[7], ARGV[4])
return {'reverted', id}
"""

# ARGV[2] == '1': the work of an idle compaction, whose revision has an outcome already (a
# skip under the threshold): read it all the same, unless a newer revision waits (the normal
# path has it) or none exists; KEYS[1] is then left alone.
_TAKE = """
local latest = redis.call('GET', KEYS[2])
local handled = redis.call('GET', KEYS[3]) or '-1'
local idle = ARGV[2] == '1'
if not idle then redis.call('DEL', KEYS[1]) end
if not latest or (tonumber(latest) <= tonumber(handled)) ~= idle then
  return {latest or false, handled}
end
local payload = redis.call('GET', KEYS[6])
local digest = redis.call('HGET', KEYS[5], 'd')
local memo = false
if digest and digest ~= ARGV[1] then memo = redis.call('HGET', KEYS[5], 'b') end
return {latest, handled, payload or false, redis.call('LRANGE', KEYS[4], 0, -1), digest or false,
        memo, redis.call('GET', KEYS[7]) or false, redis.call('EXISTS', KEYS[8]),
        redis.call('HMGET', KEYS[9], 'n', 'f', 't')}
"""

# Takes the lock unless another worker holds it or (ARGV[3], when given) that revision has an
# outcome already: {'taken', token}, {'held'} or {'handled'}.
_ACQUIRE = """
if ARGV[3] ~= '' and tonumber(redis.call('GET', KEYS[3]) or '-1') >= tonumber(ARGV[3]) then
  return {'handled'}
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'held'} end
local token = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], token, 'PX', ARGV[1])
return {'taken', tostring(token)}
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A compaction on demand: stored for the workers if the conversation has a snapshot (a newer
# request replaces a waiting one). KEYS: requested, latest; ARGV: the request, its TTL.
# Replies {'requested', latest, replaced request or false} or {'no_snapshot'}.
_REQUEST = """
local latest = redis.call('GET', KEYS[2])
if not latest then return {'no_snapshot'} end
local replaced = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return {'requested', latest, replaced or false}
"""

# What a requested compaction works on: the request, the newest revision, its snapshot, the
# recent compactions and their composition. KEYS: requested, latest, snapshot, last, composed.
_TAKE_REQUEST = """
local request = redis.call('GET', KEYS[1])
if not request then return {false} end
return {request, redis.call('GET', KEYS[2]) or false, redis.call('GET', KEYS[3]) or false,
        redis.call('LRANGE', KEYS[4], 0, -1), redis.call('GET', KEYS[5]) or false,
        redis.call('EXISTS', KEYS[6])}
"""

# Forget a request once its outcome is published, unless a newer one replaced it meanwhile.
_DONE_REQUEST = """
local request = redis.call('GET', KEYS[1])
if request and cjson.decode(request)['request_id'] == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# The idle scan's take, for each tenant given (KEYS: cw:{.idle}:tenants, then each tenant's
# index and busy set; ARGV: idle_since, expired_before, busy_since, per_tenant, now, busy_ttl_s,
# how many tenants this scan looks at from the first one given on, the tenants). A tenant may
# have per_tenant conversations handed out at once: as many of its oldest due ones as it has
# room for move from its index to its busy set. Its place in the tenant list becomes its oldest
# entry's time or, while it still has due entries, idle_since less a microsecond per tenant
# looked at after it: due at the next scan, but behind every tenant due longer and in the order
# of this scan, so the tenants take turns. Scores go back as strings of 17 digits (a Lua number
# is written with 14). Replies each tenant's taken ids.
_TAKE_IDLE = """
local since = tonumber(ARGV[1])
local out = {}
for i = 1, (#KEYS - 1) / 2 do
  local index, busy, tenant = KEYS[2 * i], KEYS[2 * i + 1], ARGV[7 + i]
  redis.call('ZREMRANGEBYSCORE', index, '-inf', ARGV[2])
  redis.call('ZREMRANGEBYSCORE', busy, '-inf', ARGV[3])
  local room = tonumber(ARGV[4]) - redis.call('ZCARD', busy)
  local taken = {}
  if room > 0 then
    taken = redis.call('ZRANGEBYSCORE', index, '-inf', ARGV[1], 'LIMIT', 0, room)
  end
  if #taken > 0 then
    local scored = {}
    for k, conv in ipairs(taken) do scored[2 * k - 1], scored[2 * k] = ARGV[5], conv end
    redis.call('ZREM', index, unpack(taken))
    redis.call('ZADD', busy, unpack(scored))
    redis.call('EXPIRE', busy, ARGV[6])
  end
  local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('ZREM', KEYS[1], tenant)
  elseif tonumber(first[2]) <= since then
    local behind = since - (tonumber(ARGV[7]) - i) * 1e-6
    redis.call('ZADD', KEYS[1], string.format('%.17g', behind), tenant)
  else
    redis.call('ZADD', KEYS[1], first[2], tenant)
  end
  out[i] = taken
end
return out
"""

SubmitStatus = Literal["queued", "coalesced", "superseded"]
PublishStatus = Literal["published", "duplicate"]
# revert: done; not the newest completed compaction (or none); a worker holds the conversation
RevertStatus = Literal["reverted", "not_newest", "busy"]
# approve / decline: done; no such proposal held; the compactions changed since it was proposed
ReviewStatus = Literal["approved", "declined", "not_held", "changed"]
_REVERT_ATTEMPTS = 5  # the composition changed under a revert: read it again
LockStatus = Literal["taken", "held", "handled"]


@dataclass(frozen=True)
class SubmitResult:
    status: SubmitStatus
    revision: int  # the conversation's newest revision now known


@dataclass(frozen=True)
class RequestResult:
    """A stored compaction request: the revision it compacts (the newest submitted now), and
    the id of a waiting request it replaced, if any."""

    request_id: str
    revision: int
    replaced: str | None = None


@dataclass(frozen=True)
class RequestedWork:
    """What a requested compaction works on (``request`` None: nothing is asked any more)."""

    request: CompactRequest | None
    latest: int | None = None
    payload: bytes | None = None
    compactions: list[CompletedEvent] = field(default_factory=list)  # oldest first
    composed: ComposedCompaction | None = None
    held: bool = False  # a compaction is held for review: none other is made meanwhile


@dataclass(frozen=True)
class LockClaim:
    """What asking for a conversation's lock got: ``taken``, with the fencing token; or none,
    because another worker ``held`` it, or the revision asked about was ``handled`` already."""

    status: LockStatus
    token: str | None = None


@dataclass(frozen=True)
class Work:
    latest: int | None  # newest submitted revision (None: nothing, or expired)
    handled: int  # newest revision with an outcome
    payload: bytes | None = None  # the newest snapshot, when there is work to do
    compactions: list[CompletedEvent] = field(default_factory=list)  # oldest first
    # The conversation's evaluation memo (worker.reuse.memo): its digest, and its bytes unless the
    # caller already knew that digest.
    memo_digest: str | None = None
    memo: bytes | None = None
    # Every compaction so far as one edit of the full history (worker.wire.composed), if any.
    composed: ComposedCompaction | None = None
    # A compaction is held for review (cw:{conv}:proposal): none other is made meanwhile.
    held: bool = False
    # The conversation's pace (cw:{conv}:activity): snapshots, first and newest submit time.
    activity: Activity | None = None

    @property
    def pending(self) -> bool:
        return self.latest is not None and self.latest > self.handled


class RedisState:
    """The service's state in Redis. Thread-safe (redis-py pools connections)."""

    def __init__(self, client: redis.Redis, config: RedisConfig) -> None:
        self.client: Any = client  # redis-py's reply types are too loose to type usefully
        self.config = config
        self._submit = client.register_script(_SUBMIT)
        self._publish = client.register_script(_PUBLISH)
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._take = client.register_script(_TAKE)
        self._release = client.register_script(_RELEASE)
        self._unqueue = client.register_script(_UNQUEUE)
        self._revert = client.register_script(_REVERT)
        self._request = client.register_script(_REQUEST)
        self._take_request = client.register_script(_TAKE_REQUEST)
        self._done_request = client.register_script(_DONE_REQUEST)
        self._approve = client.register_script(_APPROVE)
        self._decline = client.register_script(_DECLINE)
        self._take_idle = client.register_script(_TAKE_IDLE)

    # --- snapshots ---------------------------------------------------------------------------

    def store_snapshot(self, conversation_id: str, revision: int, payload: bytes) -> SubmitResult:
        """Claim check: the payload stays in Redis; the broker message carries only ids."""
        ttl = self.config.snapshot_ttl_s
        packed = zlib.compress(payload, 1)
        now = time.time()
        with redis_errors("storing a snapshot"):
            # Pending before the snapshot exists (a crash after this leaves an entry the
            # reconciler settles), and again after it: a publish may have removed the entry
            # in between, having seen the older revision as the newest (keys.py).
            self.client.zadd(keys.PENDING, {conversation_id: now}, nx=True)
            status, rev = self._submit(
                keys=[
                    keys.snapshot(conversation_id),
                    keys.latest(conversation_id),
                    keys.queued(conversation_id),
                    keys.handled(conversation_id),
                ],
                args=[packed, revision, ttl],
            )
            pipe = self.client.pipeline(transaction=False)
            if _text(status) != "superseded":
                pipe.zadd(keys.PENDING, {conversation_id: now}, nx=True)
                self._note_activity(pipe, conversation_id, now)
            self._touch_tenant(pipe, conversation_id, now)
            pipe.execute()
        return SubmitResult(status=_text(status), revision=int(rev))  # type: ignore[arg-type]

    def _note_activity(self, pipe: Any, conversation_id: str, now: float) -> None:
        """Queue on ``pipe``: the conversation's pace (``cw:{conv}:activity``, for the cost
        model) and its place in the idle index (for idle compaction). Outside the submit
        script, which programs in other languages run as documented: without these a
        conversation is only priced as of unknown pace and never idle-compacted."""
        activity = keys.activity(conversation_id)
        pipe.hsetnx(activity, "f", now)
        pipe.hset(activity, "t", now)
        pipe.hincrby(activity, "n", 1)
        pipe.expire(activity, self.config.snapshot_ttl_s)
        self._note_idle(pipe, conversation_id, now)

    def _note_idle(self, pipe: Any, conversation_id: str, now: float) -> None:
        """Queue on ``pipe``: the conversation in its tenant's idle index, then the tenant in
        the tenant list (keys.py). The index first: a scan in between finds the entry, or
        finds the index empty before it and drops a tenant that this puts back."""
        tenant = idle_tenant(conversation_id)
        ttl = self.config.snapshot_ttl_s
        index = keys.idle_conversations(tenant)
        pipe.zadd(index, {conversation_id: now})
        pipe.zremrangebyrank(index, 0, -IDLE_INDEX_MAX - 1)
        pipe.expire(index, ttl)
        # Tenants no scan has looked at for the snapshots' lifetime (none runs: idle compaction
        # is off) are dropped, before this one is added: the list stays as long as a day's.
        pipe.zremrangebyscore(keys.IDLE_TENANTS, "-inf", f"({now - ttl!r}")
        pipe.zadd(keys.IDLE_TENANTS, {tenant: now}, lt=True)

    def unqueue(self, conversation_id: str, revision: int) -> bool:
        """Clear the queued flag that ``store_snapshot`` set for ``revision`` (its task could
        not be sent), if it is still that one; whether it was cleared."""
        with redis_errors("clearing the queued flag"):
            cleared = self._unqueue(keys=[keys.queued(conversation_id)], args=[revision])
        return bool(cleared)

    def take_work(self, conversation_id: str, *, known_memo: str = "", idle: bool = False) -> Work:
        """In one round trip: clear the queued flag (later submissions enqueue afresh), and read
        the newest and handled revisions, the newest snapshot, the recent compactions, the
        evaluation memo (its bytes only when its digest is not ``known_memo``) and the
        conversation's pace. ``idle``: the work of an idle compaction, whose newest revision
        has an outcome already (then no work when one is still pending, and the queued flag
        is left as it is)."""
        with redis_errors("reading the conversation's work"):
            reply = self._take(
                keys=[
                    keys.queued(conversation_id),
                    keys.latest(conversation_id),
                    keys.handled(conversation_id),
                    keys.last_compaction(conversation_id),
                    keys.memo(conversation_id),
                    keys.snapshot(conversation_id),
                    keys.composed(conversation_id),
                    keys.proposal(conversation_id),
                    keys.activity(conversation_id),
                ],
                args=[known_memo, "1" if idle else ""],
            )
        latest = int(reply[0]) if reply[0] else None
        handled = int(reply[1])
        if len(reply) < 3:
            return Work(latest=latest, handled=handled)
        payload = zlib.decompress(reply[2]) if reply[2] else None
        compactions = _completed_events(reversed(reply[3]))
        return Work(
            latest=latest,
            handled=handled,
            payload=payload,
            compactions=compactions,
            memo_digest=_text(reply[4]) if reply[4] else None,
            memo=reply[5] or None,
            composed=_composed(reply[6], compactions),
            held=len(reply) > 7 and bool(reply[7]),
            activity=_activity(reply[8]) if len(reply) > 8 else None,
        )

    # --- compactions on demand -----------------------------------------------------------------

    def store_request(self, conversation_id: str, request: CompactRequest) -> RequestResult:
        """Store a compaction request for the conversation's newest snapshot (replacing one
        still waiting); NoSnapshot when there is none (never submitted, or expired)."""
        with redis_errors("storing a compaction request"):
            reply = self._request(
                keys=[keys.requested(conversation_id), keys.latest(conversation_id)],
                args=[request.to_json(), self.config.snapshot_ttl_s],
            )
        if _text(reply[0]) == "no_snapshot":
            raise NoSnapshot(
                f"{conversation_id} has no snapshot to compact (none submitted, or the newest "
                "one expired): submit one first"
            )
        replaced = CompactRequest.model_validate_json(reply[2]).request_id if reply[2] else None
        return RequestResult(request.request_id, int(reply[1]), replaced)

    def take_request(self, conversation_id: str) -> RequestedWork:
        """The waiting request and what it works on, in one round trip (left in place until
        :meth:`done_request`: a redelivered task finds it again)."""
        with redis_errors("reading a compaction request"):
            reply = self._take_request(
                keys=[
                    keys.requested(conversation_id),
                    keys.latest(conversation_id),
                    keys.snapshot(conversation_id),
                    keys.last_compaction(conversation_id),
                    keys.composed(conversation_id),
                    keys.proposal(conversation_id),
                ],
            )
        if not reply[0]:
            return RequestedWork(request=None)
        try:
            request = CompactRequest.model_validate_json(reply[0])
        except ValueError:  # written by a newer version, say: not ours to do
            log.warning("ignoring an unreadable compaction request of %s", conversation_id)
            return RequestedWork(request=None)
        compactions = _completed_events(reversed(reply[3]))
        return RequestedWork(
            request=request,
            latest=int(reply[1]) if reply[1] else None,
            payload=zlib.decompress(reply[2]) if reply[2] else None,
            compactions=compactions,
            composed=_composed(reply[4], compactions),
            held=len(reply) > 5 and bool(reply[5]),
        )

    def done_request(self, conversation_id: str, request_id: str) -> None:
        """Forget the request once its outcome is published (a newer one stays)."""
        with redis_errors("clearing a compaction request"):
            self._done_request(keys=[keys.requested(conversation_id)], args=[request_id])

    def acquire_lock(
        self, conversation_id: str, lease_s: float, *, unless_handled: int | None = None
    ) -> LockClaim:
        """Take the conversation's lock for ``lease_s``, with a fresh fencing token, unless
        another worker holds it or, with ``unless_handled``, that revision has an outcome
        already: both checked in the same step as the taking."""
        with redis_errors("taking the conversation lock"):
            reply = self._acquire(
                keys=[
                    keys.lock(conversation_id),
                    keys.fence(conversation_id),
                    keys.handled(conversation_id),
                ],
                args=[
                    int(lease_s * 1000),
                    self.config.stream_ttl_s,
                    "" if unless_handled is None else unless_handled,
                ],
            )
        status = _text(reply[0])
        token = _text(reply[1]) if status == "taken" else None
        return LockClaim(status=status, token=token)  # type: ignore[arg-type]

    def renew_lock(self, conversation_id: str, token: str, lease_s: float) -> bool:
        with redis_errors("renewing the conversation lock"):
            return bool(
                self._renew(keys=[keys.lock(conversation_id)], args=[token, int(lease_s * 1000)])
            )

    def release_lock(self, conversation_id: str, token: str) -> None:
        with redis_errors("releasing the conversation lock"):
            self._release(keys=[keys.lock(conversation_id)], args=[token])

    def lock_ttl_s(self, conversation_id: str) -> float:
        """Seconds left on the conversation's lock lease; 0 when nobody holds it."""
        with redis_errors("checking the conversation lock"):
            ms = int(self.client.pttl(keys.lock(conversation_id)))
        return max(ms, 0) / 1000

    def request_rerun(self, conversation_id: str) -> None:
        with redis_errors("flagging a re-evaluation"):
            self.client.set(keys.rerun(conversation_id), 1, ex=self.config.snapshot_ttl_s)

    def take_rerun(self, conversation_id: str) -> bool:
        with redis_errors("reading the re-evaluation flag"):
            return self.client.getdel(keys.rerun(conversation_id)) is not None

    @contextlib.contextmanager
    def lease(self, conversation_id: str, token: str, lease_s: float) -> Iterator[threading.Event]:
        """Keep the lock alive while the body runs; the yielded event is set if it was lost."""
        lost = threading.Event()
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(lease_s / 3):
                try:
                    if not self.renew_lock(conversation_id, token, lease_s):
                        lost.set()
                        return
                except TransientError:
                    continue  # Redis blinked; the publish check is the final word

        thread = threading.Thread(target=renew, name=f"lease-{conversation_id}", daemon=True)
        thread.start()
        try:
            yield lost
        finally:
            stop.set()
            thread.join(timeout=5)

    # --- events ------------------------------------------------------------------------------

    def publish(
        self,
        event: CompactionEvent,
        *,
        ahead: Sequence[CompactionEvent] = (),
        fencing_token: str | None = None,
        handled_revision: int | None = None,
        counters: dict[str, float] | None = None,
        memo: bytes | None = None,
        memo_digest: str = "",
        dedup_ttl_s: int | None = None,
        composed: ComposedCompaction | None = None,
        proposal: HeldProposal | None = None,
    ) -> PublishStatus:
        """Append ``event`` to its conversation's stream once (by ``event_id``), announce it,
        record the handled revision, add ``counters`` and store the conversation's evaluation
        ``memo``; all of it only if ``event`` is published now, not a duplicate. Raises
        LeaseLost if the fencing token is stale. The status is ``event``'s.

        ``ahead``: events of the same conversation to append before ``event`` in the same step
        (one round trip), each once by its own id; they record nothing else.
        ``dedup_ttl_s``: how long the event ids are remembered against a second publish
        (default ``stream_ttl_s``); an event that only a redelivery could publish again needs
        it only as long as a redelivery can come. ``composed``: with a completed event, every
        compaction so far as one edit (stored in the same step, so it always includes the
        newest). ``proposal``: with a ``compaction.proposed`` event, what approving it needs,
        stored as the conversation's held compaction in the same step."""
        conv = event.conversation_id
        events = [*ahead, event]
        if any(e.conversation_id != conv for e in ahead):
            raise ValueError(f"events published together must all be of {conv}")
        is_completed = event.type == "compaction.completed"
        texts = [e.to_json() for e in events]
        with redis_errors("publishing an event"):
            reply = self._publish(
                keys=[
                    keys.events(conv),
                    keys.lock(conv),
                    keys.handled(conv),
                    keys.last_compaction(conv),
                    keys.latest(conv),
                    keys.memo(conv),
                    keys.composed(conv),
                    keys.proposal(conv),
                    *(keys.published(conv, e.event_id) for e in events),
                ],
                args=[
                    fencing_token or "",
                    "" if handled_revision is None else handled_revision,
                    self.config.stream_ttl_s,
                    self.config.stream_maxlen,
                    keys.announce(conv),
                    "1" if is_completed else "0",
                    LAST_COMPACTIONS,
                    memo or "",
                    self.config.snapshot_ttl_s,
                    memo_digest,
                    composed.to_json() if composed is not None and is_completed else "",
                    dedup_ttl_s or self.config.stream_ttl_s,
                    proposal.to_json() if proposal is not None else "",
                    *texts,
                ],
            )
        if _text(reply[0]) == "lease_lost":
            raise LeaseLost(f"lost the lock on {conv} before publishing; not published")
        newest, statuses = int(reply[0]), [_text(s) for s in reply[1:]]
        status = statuses[-1]
        published = [text for text, s in zip(texts, statuses, strict=True) if s == "published"]
        if published:
            # The counters describe the outcome: counted only with it.
            self._fan_out(published, (counters or {}) if status == "published" else {}, conv)
        if status == "published" and newest and handled_revision is not None:
            self._forget_pending(conv, handled_revision)
        return status  # type: ignore[return-value]

    def _fan_out(
        self, texts: list[str], counters: dict[str, float], conversation_id: str | None = None
    ) -> None:
        """The global side of a publish, after it (keys.py): the all-conversations stream, the
        counters and the tenant's index, in one round trip."""
        with redis_errors("publishing an event"):
            pipe = self.client.pipeline(transaction=False)
            for as_json in texts:
                pipe.xadd(keys.RECENT, {"event": as_json}, maxlen=RECENT_MAXLEN, approximate=True)
            for name, amount in counters.items():
                pipe.hincrbyfloat(keys.METRICS, name, amount)
            if conversation_id is not None:
                self._touch_tenant(pipe, conversation_id, time.time())
            pipe.execute()

    def _touch_tenant(self, pipe: Any, conversation_id: str, now: float) -> None:
        """Queue on ``pipe``: the conversation first in its tenant's index, the index trimmed
        to the newest :data:`TENANT_INDEX_MAX` and expiring with the streams."""
        tenant = _tenant_of(conversation_id)
        if tenant is None:
            return
        index = keys.tenant_conversations(tenant)
        pipe.zadd(index, {conversation_id: now})
        pipe.zremrangebyrank(index, 0, -TENANT_INDEX_MAX - 1)
        pipe.expire(index, self.config.stream_ttl_s)

    def _forget_pending(self, conversation_id: str, revision: int | None) -> None:
        """Remove the conversation from ``cw:pending`` (its newest revision, ``revision``, or
        with None its expired snapshot, is settled), and put it back at once if a submission
        raised ``latest`` meanwhile: that submission may have found the entry still there."""
        with redis_errors("updating pending conversations"):
            self.client.zrem(keys.PENDING, conversation_id)
            if not _settled(self.client.get(keys.latest(conversation_id)), revision):
                self.client.zadd(keys.PENDING, {conversation_id: time.time()}, nx=True)

    def revert(
        self, conversation_id: str, event_id: str, reason: str | None, now: datetime
    ) -> tuple[RevertStatus, RevertedEvent | None, str]:
        """Restore the conversation's newest completed compaction ``event_id``: publish a
        ``compaction.reverted`` event, take the compaction out of ``cw:{conv}:last`` and put
        the composition back to what it was before it (:func:`worker.wire.composed.without`),
        in one step. Returns the status, the event and its stream id: ``not_newest`` when it
        is not the newest (or there is none), ``busy`` while a worker holds the
        conversation."""
        for _attempt in range(_REVERT_ATTEMPTS):
            with redis_errors("reading the newest compaction"):
                pipe = self.client.pipeline(transaction=False)
                pipe.lindex(keys.last_compaction(conversation_id), 0)
                pipe.get(keys.composed(conversation_id))
                head, stored = pipe.execute()
            newest = _completed_events([head]) if head else []
            if not newest or newest[0].event_id != event_id:
                return "not_newest", None, ""
            composed = _composed(stored, newest)
            back = without(composed, event_id)
            event = reverted_event(
                conversation_id,
                newest[0].revision,
                now,
                reverted_event_id=event_id,
                reason=reason,
            )
            with redis_errors("restoring a compaction"):
                reply = self._revert(
                    keys=[
                        keys.last_compaction(conversation_id),
                        keys.composed(conversation_id),
                        keys.lock(conversation_id),
                        keys.events(conversation_id),
                        keys.published(conversation_id, event.event_id),
                    ],
                    args=[
                        event_id,
                        stored or b"",
                        "" if back is None else back.to_json(),
                        event.to_json(),
                        self.config.stream_maxlen,
                        self.config.stream_ttl_s,
                        keys.announce(conversation_id),
                    ],
                )
            status, stream_id = _text(reply[0]), _text(reply[1])
            if status == "changed":
                continue
            if status == "reverted":
                counters = {"compactions_reverted_total": 1.0}
                self._fan_out([event.to_json()], counters, conversation_id)
                return "reverted", event, stream_id
            if status == "duplicate":  # reverted by another request just now
                return "not_newest", None, ""
            return status, None, ""  # type: ignore[return-value]
        raise RedisUnavailable(
            f"the compactions of {conversation_id} kept changing while restoring one",
            code="redis_error",
        )

    # --- review before apply -------------------------------------------------------------

    def held_proposal(self, conversation_id: str) -> HeldProposal | None:
        """The compaction held for review, if any (None also for one this version cannot
        read, with a warning)."""
        with redis_errors("reading the held compaction"):
            stored = self.client.get(keys.proposal(conversation_id))
        if stored is None:
            return None
        try:
            return HeldProposal.model_validate_json(stored)
        except ValueError:
            log.warning("ignoring an unreadable cw:{conv}:proposal", exc_info=True)
            return None

    def approve(
        self, held: HeldProposal, now: datetime, *, by: str, summary: Summary | None = None
    ) -> tuple[ReviewStatus, CompletedEvent | None, str]:
        """Publish the held compaction ``held`` as ``compaction.completed`` (with ``summary``
        in place of the proposed one, if given: an edit, checked by the caller), in the same
        step as it enters ``cw:{conv}:last`` and the composition and leaves the proposal.
        Returns the status, the event and its stream id."""
        proposal = held.event
        conv = proposal.conversation_id
        event = approved_event(proposal, now, by=by, summary=summary)
        composed = held.composed
        if composed is not None:
            composed = approved_composition(
                composed, event.event_id, proposal.compaction.summary.text, summary
            )
        with redis_errors("approving a compaction"):
            reply = self._approve(
                keys=[
                    keys.proposal(conv),
                    keys.last_compaction(conv),
                    keys.composed(conv),
                    keys.events(conv),
                    keys.published(conv, event.event_id),
                ],
                args=[
                    proposal.event_id,
                    held.base or "",
                    event.to_json(),
                    "" if composed is None else composed.to_json(),
                    self.config.stream_maxlen,
                    self.config.stream_ttl_s,
                    keys.announce(conv),
                    LAST_COMPACTIONS,
                ],
            )
        status, stream_id = _text(reply[0]), _text(reply[1])
        if status == "approved":
            self._fan_out([event.to_json()], {"compactions_approved_total": 1.0}, conv)
            return "approved", event, stream_id
        return ("not_held" if status == "duplicate" else status), None, ""  # type: ignore[return-value]

    def decline(
        self, held: HeldProposal, now: datetime, *, by: str, reason: str | None
    ) -> tuple[ReviewStatus, DeclinedEvent | None, str]:
        """Decline the held compaction: publish ``compaction.declined`` and drop the proposal,
        in one step; the next snapshot over the threshold proposes again."""
        event = declined_event(held.event, now, by=by, reason=reason)
        conv = event.conversation_id
        with redis_errors("declining a compaction"):
            reply = self._decline(
                keys=[
                    keys.proposal(conv),
                    keys.events(conv),
                    keys.published(conv, event.event_id),
                ],
                args=[
                    held.event.event_id,
                    event.to_json(),
                    self.config.stream_maxlen,
                    self.config.stream_ttl_s,
                    keys.announce(conv),
                ],
            )
        status, stream_id = _text(reply[0]), _text(reply[1])
        if status == "declined":
            self._fan_out([event.to_json()], {"compactions_declined_total": 1.0}, conv)
            return "declined", event, stream_id
        return "not_held", None, ""

    def is_published(self, conversation_id: str, event_id: str) -> bool:
        with redis_errors("checking an event"):
            return bool(self.client.exists(keys.published(conversation_id, event_id)))

    def read_events(
        self,
        conversation_id: str,
        *,
        after: str = "0",
        block_ms: int | None = None,
        count: int = 100,
    ) -> list[tuple[str, dict[str, Any] | None]]:
        """Events after stream id ``after`` (``"0"`` for all), oldest first. With ``block_ms``,
        waits that long (0: until one comes) when there is none yet. An entry that holds no
        JSON event comes with None (and a warning), so that a reader moves past it."""
        stream = keys.events(conversation_id)
        if block_ms is not None and after == "$":
            after = self.newest_id(conversation_id)
        reply = None
        for block in [None] if block_ms is None else block_slices(block_ms):
            with redis_errors("reading events"):
                reply = self.client.xread({stream: after}, count=count, block=block)
            if reply:
                break
        return stream_entries(reply, stream)

    def newest_id(self, conversation_id: str) -> str:
        """The id of the conversation's newest event (``0-0`` if none): what ``$`` means now,
        fixed, for a follower that reads more than once."""
        with redis_errors("reading events"):
            return _newest(self.client.xrevrange(keys.events(conversation_id), count=1))

    def recent_events(self, count: int = 20) -> list[dict[str, Any]]:
        with redis_errors("reading recent events"):
            entries = self.client.xrevrange(keys.RECENT, count=count)
        readable = (entry_event(i, fields, keys.RECENT) for i, fields in entries)
        return [event for event in readable if event is not None]

    # --- housekeeping ------------------------------------------------------------------------

    def stale_pending(self, older_than_s: float, limit: int = 500) -> list[str]:
        """Conversations submitted more than ``older_than_s`` ago whose newest revision has no
        outcome yet."""
        with redis_errors("reading pending conversations"):
            members = self.client.zrangebyscore(
                keys.PENDING, 0, time.time() - older_than_s, start=0, num=limit
            )
        return [_text(m) for m in members]

    def take_idle(
        self,
        idle_since: float,
        *,
        busy_for_s: float,
        per_tenant: int = IDLE_PER_TENANT,
        tenants: int = IDLE_SCAN_TENANTS,
    ) -> list[str]:
        """The conversations to hand to an idle compaction now, taken out of the idle index (a
        later submission puts one back): of the ``tenants`` tenants due longest, each one's
        oldest whose newest snapshot came before ``idle_since`` (seconds since the epoch), as
        many as keep its hand-outs not yet finished (:meth:`finish_idle`) at ``per_tenant``,
        interleaved (every tenant's first, then every tenant's second, ...). A hand-out not
        finished after ``busy_for_s`` is taken for lost; entries older than the snapshots'
        lifetime are dropped (their snapshot is gone). Redis' work is bounded by ``tenants``
        times ``per_tenant``, whatever the index holds."""
        now = time.time()
        args: list[str | int] = [
            repr(idle_since),
            repr(now - self.config.snapshot_ttl_s),  # expired: older entries are dropped
            repr(now - busy_for_s),  # lost: older hand-outs are forgotten
            per_tenant,
            repr(now),
            math.ceil(busy_for_s),
        ]
        with redis_errors("reading idle conversations"):
            due = self.client.zrangebyscore(
                keys.IDLE_TENANTS, "-inf", idle_since, start=0, num=tenants
            )
            names = [_text(t) for t in due]
            taken: list[list[Any]] = []
            for start in range(0, len(names), _IDLE_TENANTS_PER_CALL):
                batch = names[start : start + _IDLE_TENANTS_PER_CALL]
                idle_keys = [k for t in batch for k in _idle_keys(t)]
                taken += self._take_idle(
                    keys=[keys.IDLE_TENANTS, *idle_keys], args=[*args, len(names) - start, *batch]
                )
        return [_text(c) for c in _interleaved(taken)]

    def finish_idle(self, conversation_id: str) -> None:
        """The conversation's idle compaction ended (whatever its outcome): its tenant may have
        another handed out."""
        tenant = idle_tenant(conversation_id)
        with redis_errors("finishing an idle compaction"):
            self.client.zrem(keys.idle_busy(tenant), conversation_id)

    def settle_pending(self, conversation_id: str, revision: int | None) -> None:
        """Stop reconciling the conversation: its ``revision`` has a final outcome (or, with
        None, its snapshot expired) and nothing newer was submitted meanwhile."""
        with redis_errors("updating pending conversations"):
            latest = self.client.get(keys.latest(conversation_id))
        if _settled(latest, revision):
            self._forget_pending(conversation_id, revision)

    def reschedule_pending(self, due: dict[str, float]) -> None:
        """Set, in one round trip, when the reconciler next looks at each conversation (a time
        ``reconcile_after_s`` before it, as scores are submit times); only conversations still
        pending are updated."""
        if due:
            with redis_errors("updating pending conversations"):
                self.client.zadd(keys.PENDING, due, xx=True)

    def lease_ttls_s(self, conversation_ids: list[str]) -> list[float]:
        """:meth:`lock_ttl_s` of each conversation, in one round trip."""
        with redis_errors("checking conversation locks"):
            pipe = self.client.pipeline(transaction=False)
            for conversation_id in conversation_ids:
                pipe.pttl(keys.lock(conversation_id))
            replies = pipe.execute()
        return [max(int(ms), 0) / 1000 for ms in replies]

    def incr(self, counter: str, amount: float = 1) -> None:
        """Best effort: a metric must never fail the work it measures."""
        with contextlib.suppress(TransientError), redis_errors("counting"):
            self.client.hincrbyfloat(keys.METRICS, counter, amount)

    def incr_many(self, counters: dict[str, float]) -> None:
        with contextlib.suppress(TransientError), redis_errors("counting"):
            pipe = self.client.pipeline(transaction=False)
            for name, amount in counters.items():
                pipe.hincrbyfloat(keys.METRICS, name, amount)
            pipe.execute()

    def counters(self) -> dict[str, float]:
        with redis_errors("reading metrics"):
            raw = self.client.hgetall(keys.METRICS)
        return {_text(k): float(v) for k, v in raw.items()}


def _completed_events(stored: Iterable[bytes]) -> list[CompletedEvent]:
    """The compactions kept in ``cw:{conv}:last``, read tolerantly: one that cannot be read (written
    by a newer version, or damaged) is left out with a warning, never fails the evaluation."""
    out = []
    for raw in stored:
        try:
            event = parse_event(raw)
        except ValueError:
            log.warning("ignoring an unreadable compaction event in cw:{conv}:last", exc_info=True)
            continue
        if isinstance(event, CompletedEvent):
            out.append(event)
    return out


def _composed(stored: bytes | None, compactions: list[CompletedEvent]) -> ComposedCompaction | None:
    """The stored composition, when it can be read and includes the newest compaction kept in
    ``cw:{conv}:last`` (a worker of a version before it existed may have published since)."""
    if not stored:
        return None
    try:
        composed = ComposedCompaction.model_validate_json(stored)
    except ValueError:
        log.warning("ignoring an unreadable cw:{conv}:composed", exc_info=True)
        return None
    if compactions and compactions[-1].event_id != composed.event_id:
        return None
    return composed


def _activity(fields: list[Any]) -> Activity | None:
    """``cw:{conv}:activity``'s ``n``, ``f``, ``t`` as the cost model's pace; None if absent."""
    count, first, last = fields
    if count is None or first is None or last is None:
        return None
    return Activity(snapshots=int(count), first_at=float(first), last_at=float(last))


def idle_tenant(conversation_id: str) -> str:
    """Whose turn a conversation's idle compaction takes: its tenant, or :data:`NO_TENANT`."""
    return _tenant_of(conversation_id) or NO_TENANT


def _idle_keys(tenant: str) -> tuple[str, str]:
    """The tenant's idle index and busy set, as the take script's KEYS want them."""
    return keys.idle_conversations(tenant), keys.idle_busy(tenant)


def _interleaved(lists: Sequence[Sequence[_T]]) -> list[_T]:
    """Every list's first item, then every list's second, ...: one turn each in order."""
    longest = max((len(items) for items in lists), default=0)
    return [items[k] for k in range(longest) for items in lists if k < len(items)]


def _tenant_of(conversation_id: str) -> str | None:
    """The tenant of an internal conversation id (``acme:c-42`` -> ``acme``, as
    ``compactor serve`` names them), None for an id without a tenant prefix."""
    tenant, colon, _rest = conversation_id.partition(":")
    return tenant if colon and tenant else None


def _settled(latest: bytes | None, revision: int | None) -> bool:
    """Whether nothing newer than ``revision`` (None: nothing at all) was submitted, given the
    conversation's ``latest``."""
    if revision is None:
        return latest is None
    return latest is not None and int(latest) <= revision


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
