"""Sending one LLM request safely: deadlines, retries, a circuit breaker, error conversion.

Every httpx exception and every HTTP status is converted here, once, into our error tree:

============================  ==========================  ======  =================
what happened                 error class                 retry   code
============================  ==========================  ======  =================
429                           LLMTransientError           yes     llm_rate_limited
5xx                           LLMTransientError           yes     llm_server_error
timeout (attempt or deadline) LLMTransientError           yes     llm_timeout
connection refused/reset/drop LLMTransientError           yes     llm_connection_error
breaker open                  LLMTransientError           no      circuit_open
2xx that does not parse       LLMTransientError           no      llm_malformed
401 / 403                     LLMPermanentError           no      llm_auth_failed
other 4xx                     LLMPermanentError           no      llm_rejected
bad URL / key / response size LLMPermanentError           no      llm_bad_config
============================  ==========================  ======  =================

Retries use exponential backoff with full jitter (a uniform draw below ``base * 2**attempt``,
capped), so that many workers hit by the same outage do not retry in lockstep. A ``Retry-After``
(seconds or HTTP-date) replaces the draw. Nothing waits past the overall deadline: when the
next attempt could not start before it, the last error is raised at once.

A malformed answer is not retried in the call: at temperature 0 the same request tends to get
the same answer, and the task-level retry (it is transient) gets a fresh chance later.

The circuit breaker counts consecutive failed attempts (429, 5xx, timeouts, connection errors,
malformed answers). At ``circuit_failure_threshold`` it opens for ``circuit_reset_s``: every call
fails at once with ``circuit_open`` instead of spending its whole retry budget on a dead
provider. Then one probe is let through (half-open); its success closes the breaker, its failure
opens it again. A 4xx other than 429 proves the provider is up, so it counts as a success.
A call reports the first real cause: when its retry finds the breaker open (opened by its own
failures or its siblings'), it raises the failure it met, not ``circuit_open``; a call refused
without trying says ``circuit_open`` with the code of the failure that opened the breaker.

Time a call spends waiting for one of our own ``max_concurrency`` slots is local load, not the
provider's slowness: it counts against neither the attempt's timeout, nor the summary's
deadline (:class:`Deadline` gives it back), nor the breaker (asked only once the slot is held).

API keys never reach a message: errors are built from our own text, the HTTP status and the
provider's error *type* only, and anything taken from an exception is scrubbed of the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx

from worker.errors import CompactorError, LLMPermanentError, LLMTransientError
from worker.summarize.providers import HttpCall, error_detail, malformed

log = logging.getLogger(__name__)
T = TypeVar("T")
REDACTED = "[redacted]"


class Deadline:
    """When a summary must end (``time.monotonic()``), less the time its calls spent queued
    behind our own ``max_concurrency``: that wait is this process's load, not the provider's
    slowness, so it is given back. Each call has its own (:meth:`child`), moved by its own wait;
    the summary's stands still while any of its calls waits, then moves to the latest of its
    calls'. Changed on the loop thread only; other threads only read it."""

    def __init__(self, at: float, parent: Deadline | None = None) -> None:
        self.at = at
        self._parent = parent
        self._waiting = 0  # calls of this deadline (or its children) waiting for a slot

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def child(self) -> Deadline:
        return Deadline(self.at, self)

    def remaining(self) -> float:
        if self._waiting:
            return math.inf
        return self.at - time.monotonic()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The time spent inside is given back to this deadline and pauses its parents'."""
        chain: list[Deadline] = []
        node: Deadline | None = self
        while node is not None:
            chain.append(node)
            node = node._parent
        started = time.monotonic()
        for deadline in chain:
            deadline._waiting += 1
        try:
            yield
        finally:
            self.at += time.monotonic() - started
            for deadline in chain:
                deadline._waiting -= 1
                deadline.at = max(deadline.at, self.at)


@dataclass(frozen=True)
class RetryPolicy:
    timeout_s: float
    max_retries: int
    backoff_base_s: float
    backoff_max_s: float
    # A summary is a few KiB; a body this large is a misbehaving server, not an answer.
    max_response_bytes: int = 8 * 1024 * 1024


def backoff_s(attempt: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(max, base * 2**attempt)]."""
    ceiling = min(policy.backoff_max_s, policy.backoff_base_s * (2 ** min(attempt, 30)))
    return rng.uniform(0.0, ceiling)


def retry_after_s(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds, from delta-seconds or an HTTP-date; None if absent or bad."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


class Secret:
    """A credential that never shows itself: not in repr, str, logs or captured frame locals."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__


def scrub(text: str, secret: Secret | None) -> str:
    """``text`` with the secret replaced; very short secrets are left alone (they'd match noise)."""
    if secret is not None and len(secret.reveal()) >= 8:
        text = text.replace(secret.reveal(), REDACTED)
    return text


class CircuitBreaker:
    """Closed -> open after N consecutive failures -> half-open after a pause -> one probe."""

    def __init__(
        self,
        failure_threshold: int,
        reset_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = failure_threshold
        self._reset_s = reset_s
        self._clock = clock
        self._lock = threading.Lock()  # cheap, and keeps it correct if used off the loop
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        self._cause = ""  # the code of the failure that opened it: what callers are told

    @property
    def state(self) -> str:
        with self._lock:
            if self._opened_at is None:
                return "closed"
            if self._probing or self._clock() - self._opened_at >= self._reset_s:
                return "half_open"
            return "open"

    def acquire(self) -> bool:
        """Raise ``circuit_open`` unless a call may go; True when this call is the probe."""
        with self._lock:
            if self._opened_at is None:
                return False
            waited = self._clock() - self._opened_at
            if self._probing or waited < self._reset_s:
                cause = f" after {self._cause}" if self._cause else ""
                raise LLMTransientError(
                    f"the LLM provider is failing{cause}; not calling it for a while "
                    "(circuit open)",
                    code="circuit_open",
                )
            self._probing = True
            return True

    def record(self, *, ok: bool, probe: bool, cause: str = "") -> None:
        with self._lock:
            if probe:
                self._probing = False
            if ok:
                self._failures = 0
                self._opened_at = None
                return
            self._failures += 1
            if probe or self._failures >= self._threshold:
                self._cause = cause or self._cause
                if self._opened_at is None or probe:
                    log.warning("LLM circuit breaker open after %d failures", self._failures)
                self._opened_at = self._clock()

    def release_probe(self) -> None:
        """The probe ended without an answer either way (cancelled): let another one try."""
        with self._lock:
            self._probing = False


class _Attempt:
    """The outcome of one failed attempt: the error, and how long the server asked us to wait."""

    def __init__(
        self,
        error: CompactorError,
        *,
        retry: bool,
        wait_s: float | None = None,
        telling: bool = True,
    ) -> None:
        self.error = error
        self.retry = retry
        self.wait_s = wait_s
        # What the breaker learns: nothing when the attempt says nothing about the provider
        # (our deadline, our queue, our configuration); else whether it misbehaved (a 4xx is
        # an answer, so it does not count against it).
        self.telling = telling
        self.provider_fault = telling and isinstance(error, LLMTransientError)


class ClientPool:
    """The process's connections: ``max_concurrency`` of them, HTTP/1.1 keep-alive, in shards.

    One ``httpx.AsyncClient`` would do, except that httpcore's pool bookkeeping costs time
    quadratic in the number of connections on every request event (it recounts all connections
    for each idle one). Measured with 200 requests in flight on reused connections: ~29 ms of
    CPU per request in one pool of 200, ~1.7 ms across 25 pools of 8. So the pool is several
    long-lived clients of at most ``SHARD_CONNECTIONS`` connections each, and a request goes to
    the least busy shard. Callers pass the semaphore first, so a shard always has a free
    connection and never queues.
    """

    SHARD_CONNECTIONS = 8

    def __init__(self, *, max_concurrency: int, timeout_s: float, connect_timeout_s: float) -> None:
        shards = -(-max_concurrency // self.SHARD_CONNECTIONS)
        per_shard = -(-max_concurrency // shards)
        limits = httpx.Limits(
            max_connections=per_shard, max_keepalive_connections=per_shard, keepalive_expiry=30.0
        )
        # Per-operation limits; the whole attempt is bounded by asyncio.timeout in the sender.
        # No pool timeout: the sender's semaphore is the queue.
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=None)
        tls = httpx.create_ssl_context()  # loading CA certificates once, not once per shard
        self._clients = [
            # No redirects: one would resend the key to wherever it points.
            httpx.AsyncClient(limits=limits, timeout=timeout, verify=tls, follow_redirects=False)
            for _ in range(shards)
        ]
        self._busy = [0] * shards

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        # Ties go to the lowest index, so light traffic keeps reusing the same few connections.
        index = self._busy.index(min(self._busy))
        self._busy[index] += 1
        try:
            yield self._clients[index]
        finally:
            self._busy[index] -= 1

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


class ResilientSender:
    """Sends :class:`HttpCall` s over the process's :class:`ClientPool`; lives on one loop."""

    def __init__(
        self,
        pool: ClientPool,
        policy: RetryPolicy,
        breaker: CircuitBreaker,
        *,
        max_concurrency: int,
        rng: random.Random | None = None,
    ) -> None:
        self._pool = pool
        self._policy = policy
        self._breaker = breaker
        # Our own queue in front of the pool: waiting for a free connection is local load, not a
        # slow provider, so it must neither eat the deadline nor trip the breaker.
        self._slots = asyncio.Semaphore(max_concurrency)
        self._rng = rng or random.Random()

    async def send(
        self,
        call: HttpCall,
        parse: Callable[[Any], T],
        *,
        deadline: Deadline,
        secret: Secret | None,
    ) -> T:
        """The parsed answer, retrying what may succeed; raises a CompactorError otherwise.

        The error raised is the first real cause: a retry that finds the breaker open (opened
        by this call's own failures or its siblings') reports the failure this call met, not
        ``circuit_open``."""
        mine = deadline.child()
        attempt = 0
        first: CompactorError | None = None
        while True:
            try:
                outcome = await self._attempt(call, parse, deadline=mine, secret=secret)
            except LLMTransientError as exc:
                if exc.code == "circuit_open" and first is not None:
                    raise first from None
                raise
            if not isinstance(outcome, _Attempt):
                return outcome
            first = first or outcome.error
            delay = self._delay(outcome, attempt, mine)
            if delay is None:
                raise outcome.error
            log.info(
                "LLM call failed (%s), retry %d/%d in %.2fs",
                outcome.error.code,
                attempt + 1,
                self._policy.max_retries,
                delay,
            )
            await asyncio.sleep(delay)
            attempt += 1

    def _delay(self, outcome: _Attempt, attempt: int, deadline: Deadline) -> float | None:
        if not outcome.retry or attempt >= self._policy.max_retries:
            return None
        delay = outcome.wait_s
        if delay is None:
            delay = backoff_s(attempt, self._policy, self._rng)
        # Sleeping to the deadline only to give up then would waste the caller's time.
        if delay >= deadline.remaining():
            return None
        return delay

    async def _attempt(
        self,
        call: HttpCall,
        parse: Callable[[Any], T],
        *,
        deadline: Deadline,
        secret: Secret | None,
    ) -> T | _Attempt:
        if deadline.remaining() <= 0:
            return _Attempt(_deadline_error(), retry=False, telling=False)
        with deadline.paused():
            await self._slots.acquire()
        try:
            # The wait for our own slot is given back, and the breaker is asked only now: a
            # call queued behind our other calls neither loses its deadline nor holds the probe.
            probe = self._breaker.acquire()
            try:
                result = await self._exchange(call, parse, deadline=deadline, secret=secret)
            except BaseException:  # cancelled, or a bug: no verdict on the provider
                if probe:
                    self._breaker.release_probe()
                raise
        finally:
            self._slots.release()
        if isinstance(result, _Attempt) and not result.telling:
            if probe:
                self._breaker.release_probe()
            return result
        failed = isinstance(result, _Attempt) and result.provider_fault
        cause = result.error.code if isinstance(result, _Attempt) else ""
        self._breaker.record(ok=not failed, probe=probe, cause=cause)
        return result

    async def _exchange(
        self,
        call: HttpCall,
        parse: Callable[[Any], T],
        *,
        deadline: Deadline,
        secret: Secret | None,
    ) -> T | _Attempt:
        budget = min(self._policy.timeout_s, deadline.remaining())
        # Cut short by the deadline, a timeout proves nothing against the provider.
        full = budget >= self._policy.timeout_s
        try:
            async with asyncio.timeout(budget):
                status, headers, body = await self._post(call)
        except (TimeoutError, httpx.TimeoutException):
            return _Attempt(_timeout_error(budget), retry=True, telling=full)
        except CompactorError as exc:
            return _Attempt(exc, retry=False)
        except httpx.HTTPError as exc:
            return _transport_failure(exc, secret)
        return _classify(status, headers, body, parse)

    async def _post(self, call: HttpCall) -> tuple[int, httpx.Headers, bytes]:
        payload = json.dumps(call.body, ensure_ascii=False).encode("utf-8")
        limit = self._policy.max_response_bytes
        async with (
            self._pool.client() as client,
            client.stream("POST", call.url, content=payload, headers=call.headers) as response,
        ):
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise LLMPermanentError(
                        f"the LLM answer exceeds {limit} bytes",
                        code="llm_bad_config",
                    )
                chunks.append(chunk)
            return response.status_code, response.headers, b"".join(chunks)


def _classify(
    status: int, headers: httpx.Headers, body: bytes, parse: Callable[[Any], T]
) -> T | _Attempt:
    if 200 <= status < 300:
        try:
            return parse(json.loads(body))
        except (ValueError, UnicodeDecodeError):
            return _Attempt(malformed("the body is not JSON"), retry=False)
        except CompactorError as exc:
            return _Attempt(exc, retry=False)
    detail = _detail(body)
    wait = retry_after_s(headers.get("retry-after"))
    if status == 429:
        error = LLMTransientError(f"LLM rate limited (HTTP 429{detail})", code="llm_rate_limited")
        return _Attempt(error, retry=True, wait_s=wait)
    if status >= 500:
        error = LLMTransientError(
            f"LLM server error (HTTP {status}{detail})", code="llm_server_error"
        )
        return _Attempt(error, retry=True, wait_s=wait)
    code = "llm_auth_failed" if status in (401, 403) else "llm_rejected"
    return _Attempt(
        LLMPermanentError(f"LLM refused the request (HTTP {status}{detail})", code=code),
        retry=False,
    )


def _detail(body: bytes) -> str:
    try:
        detail = error_detail(json.loads(body))
    except (ValueError, UnicodeDecodeError):
        return ""
    return f", {detail}" if detail else ""


def _transport_failure(exc: httpx.HTTPError, secret: Secret | None) -> _Attempt:
    kind = type(exc).__name__
    reason = scrub(str(exc), secret)[:200]
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        error: CompactorError = LLMPermanentError(
            f"llm.base_url is not usable ({kind}: {reason})", code="llm_bad_config"
        )
        return _Attempt(error, retry=False, telling=False)
    if isinstance(exc, httpx.TransportError):
        error = LLMTransientError(
            f"cannot reach the LLM ({kind}: {reason})", code="llm_connection_error"
        )
        return _Attempt(error, retry=True)
    error = LLMPermanentError(f"LLM request failed ({kind}: {reason})", code="llm_bad_config")
    return _Attempt(error, retry=False)


def _timeout_error(budget: float) -> LLMTransientError:
    return LLMTransientError(f"the LLM did not answer within {budget:.2f}s", code="llm_timeout")


def _deadline_error(context: str = "") -> LLMTransientError:
    suffix = f" {context}" if context else ""
    return LLMTransientError(f"the summary deadline passed{suffix}", code="llm_timeout")
