"""Connections to Redis and what they do when Redis is away: a client for any form of
``[redis] url`` (standalone, Cluster, Sentinel; sync and asyncio), each with its timeouts and a
retry policy with backoff, and the one place redis-py's exceptions become our error tree
(:func:`redis_errors`), so task retries key on :class:`~worker.errors.TransientError`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from worker.backend.redis_target import DEFAULT_REDIS_URL, RedisTarget, parse_redis_url
from worker.config import Settings, redis_url
from worker.errors import ConfigError, RedisUnavailable

_T = TypeVar("_T")


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
    :func:`worker.backend.streams.await_entries`."""
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
