"""Webhooks: a tenant registers a URL and receives its conversations' events as signed POSTs.

Registrations live in Redis (``cw:webhooks:{tenant}``, a hash id -> JSON). Every ``serve``
process reads the all-conversations stream ``cw:recent`` in one consumer group
(``compactor-webhooks``), so each event is delivered by one process whichever reads it, and
after a restart delivery goes on where the group left off; an entry is acknowledged once
delivered, and one handed over but not acknowledged is delivered again (at least once).
Each delivery is signed::

    X-Compactor-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>

and retried with exponential backoff on a network error, a timeout, 429 or 5xx. URLs must be
http(s) and, unless ``[webhooks] allow_private`` is set, must not resolve to a loopback,
link-local, private, reserved or multicast address, nor to an IPv6 address that embeds one
(IPv4-mapped or -compatible, NAT64, 6to4, Teredo). The name is resolved once per attempt, by
the guard, and the POST goes to an address the guard checked (the Host header, TLS SNI and
certificate check still name the URL's host), so a name that resolves inward between the check
and the connection (DNS rebinding) cannot redirect a delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

import httpx
import redis

from worker.api.auth import Tenant
from worker.api.common import ApiError
from worker.api.state import Api
from worker.backend import keys
from worker.backend.streams import BLOCK_SLICE_MS, entry_event
from worker.errors import InvalidRequest, RedisUnavailable
from worker.wire.requests import user_text

log = logging.getLogger(__name__)

GROUP = "compactor-webhooks"
SIGNATURE_HEADER = "X-Compactor-Signature"
MAX_HOOKS_PER_TENANT = 20
#: How often a ``serve`` process delivers again what it was handed and never acknowledged.
PENDING_SWEEP_S = 15.0


class UnsafeUrl(ValueError):
    """A webhook URL that may not be called."""


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 ranges whose last 32 bits are an IPv4 address a translator or tunnel delivers to.
_EMBEDDING = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "64:ff9b::/96",  # NAT64, the well-known prefix (RFC 6052)
        "::/96",  # IPv4-compatible (deprecated, RFC 4291)
        "::ffff:0:0:0/96",  # IPv4-translated (SIIT, RFC 2765)
    )
)
# NAT64 for local use (RFC 8215): the IPv4 part sits where the operator's prefix length puts
# it, so no address in it is treated as public.
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_WEBHOOK_ID = re.compile(r"wh_[0-9a-f]{16}")
_TIMESTAMP = re.compile(r"[0-9]{1,15}")
_MAC = re.compile(r"[0-9a-f]{64}")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    return f"t={timestamp},v1={_mac(secret, timestamp, body)}"


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def verify(secret: str, header: str, body: bytes, *, tolerance_s: float = 300) -> bool:
    """What a receiver does: the signature matches and is recent. Anything malformed (a wrong
    type, a missing or repeated part, a non-ASCII or over-long value) is False, never an
    exception, so a receiver built on this answers a hostile header as unauthorized."""
    if not (
        isinstance(secret, str)
        and isinstance(header, str)
        and isinstance(body, bytes | bytearray)
        and isinstance(tolerance_s, int | float)
    ):
        return False
    parts: dict[str, list[str]] = {}
    for part in header.split(","):
        name, sep, value = part.partition("=")
        if sep:
            parts.setdefault(name.strip(), []).append(value)
    stamps, macs = parts.get("t", []), parts.get("v1", [])
    if len(stamps) != 1 or len(macs) != 1:
        return False
    if not _TIMESTAMP.fullmatch(stamps[0]) or not _MAC.fullmatch(macs[0]):
        return False
    timestamp = int(stamps[0])
    if not abs(time.time() - timestamp) <= tolerance_s:  # also False for a NaN tolerance
        return False
    try:
        expected = _mac(secret, timestamp, bytes(body))
    except UnicodeError:  # a secret with lone surrogates: not one we issued
        return False
    return hmac.compare_digest(expected, macs[0])


def is_webhook_id(text: str) -> bool:
    return _WEBHOOK_ID.fullmatch(text) is not None


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a packet to ``address`` may reach through a translator or a
    tunnel: IPv4-mapped, -compatible and -translated, NAT64, 6to4, Teredo (its server and its
    client, whose bits ``ipaddress`` un-XORs)."""
    found = [a for a in (address.ipv4_mapped, address.sixtofour) if a is not None]
    found += list(address.teredo or ())
    if any(address in network for network in _EMBEDDING):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def refusal(address: IPAddress) -> str | None:
    """Why a webhook may not be delivered to ``address``; None when it may."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in _NAT64_LOCAL:
            return "a local-use NAT64 address"
        for inner in embedded_ipv4(address):
            why = refusal(inner)
            if why is not None:
                return f"an address embedding {inner}, {why}"
    if not address.is_global or address.is_multicast:
        return "a non-public address"
    return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses ``host`` resolves to, in the resolver's order: the one lookup of a
    delivery attempt (the sender connects to what this returned and was checked)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise UnsafeUrl(f"{host} does not resolve") from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Target:
    """A webhook URL as the guard checked it: ``addresses`` are where it may be delivered."""

    url: httpx.URL
    addresses: tuple[IPAddress, ...]

    def at(self, address: IPAddress) -> httpx.URL:
        """The URL naming ``address`` instead of the host: connecting to it needs no lookup."""
        return self.url.copy_with(host=str(address))

    @property
    def host(self) -> str:
        """The URL's host as it goes on the wire (IDNA), for the Host header and TLS."""
        return self.url.raw_host.decode("ascii")


async def check_url(url: str, *, allow_private: bool) -> Target:
    """The URL resolved and checked; :class:`UnsafeUrl` unless it may be called (see the
    module docstring). With ``allow_private`` every address is accepted, but the delivery is
    still pinned to the ones resolved here."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except (httpx.InvalidURL, ValueError):
        raise UnsafeUrl("not a valid URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise UnsafeUrl("must be an http or https URL with a host")
    if parsed.userinfo:
        raise UnsafeUrl("must not carry credentials")
    if not 0 < port < 65536:
        raise UnsafeUrl(f"port {port} is out of range")
    host = parsed.raw_host.decode("ascii")
    addresses = await resolve(host, port)
    if not addresses:
        raise UnsafeUrl(f"{host} does not resolve")
    for address in addresses if not allow_private else ():
        why = refusal(address)
        if why is not None:
            raise UnsafeUrl(
                f"{host} resolves to {why} ({address}); set [webhooks] allow_private to allow it"
            )
    return Target(parsed, tuple(addresses))


async def post_pinned(
    client: httpx.AsyncClient, target: Target, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    """POST ``body`` to the first of the target's checked addresses that takes a connection.
    The URL names the address, so the client never resolves the host again; the Host header
    and the TLS server name (SNI and the certificate's check) stay the URL's host."""
    failure: httpx.ConnectError | None = None
    for address in target.addresses:
        try:
            return await client.post(
                target.at(address),
                content=body,
                headers={**headers, "Host": target.url.netloc.decode("ascii")},
                extensions={"sni_hostname": target.host},
            )
        except httpx.ConnectError as exc:
            failure = exc  # the next checked address, if any
    assert failure is not None  # check_url never returns a target without addresses
    raise failure


class Webhooks:
    """Registrations (per tenant) and the delivery loop of one ``serve`` process."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.config = api.settings.webhooks
        # No kept-alive connections: the pool keys a connection by the address it reached, and
        # one TLS-verified for a host must not carry a delivery to another host at that address.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s),
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self._loop_task: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(self.config.max_concurrency)
        self._in_flight: set[bytes] = set()  # entry ids being delivered (not acknowledged yet)
        self.consumer = f"{socket.gethostname()}"

    # --- registrations -------------------------------------------------------------------------

    async def register(self, tenant: str, doc: dict[str, Any]) -> dict[str, Any]:
        url = doc.get("url")
        if not isinstance(url, str) or len(url) > 2048:
            raise ValueError("url: a URL of at most 2048 characters is required")
        await check_url(url, allow_private=self.config.allow_private)
        conversation_id = doc.get("conversation_id")
        if conversation_id is not None and not isinstance(conversation_id, str):
            raise ValueError("conversation_id: must be a string")
        types = doc.get("types")
        if types is not None and (
            not isinstance(types, list) or not all(isinstance(t, str) for t in types)
        ):
            raise ValueError("types: must be a list of event types")
        review_default = doc.get("review_default")
        if review_default is not None and review_default not in DECISIONS:
            raise ValueError('review_default: "approve" or "reject"')
        key = keys.webhooks(tenant)
        if await self.api.aredis.hlen(key) >= MAX_HOOKS_PER_TENANT:
            raise ValueError(f"at most {MAX_HOOKS_PER_TENANT} webhooks per tenant")
        hook = {
            "id": "wh_" + secrets.token_hex(8),
            "url": url,
            "conversation_id": conversation_id,
            "types": types,
            "review_default": review_default,
            "secret": "whsec_" + secrets.token_urlsafe(24),
            "created_at": int(time.time()),
        }
        await self.api.aredis.hset(key, hook["id"], json.dumps(hook))
        return hook

    async def registered(self, tenant: str) -> list[dict[str, Any]]:
        stored = await self.api.aredis.hgetall(keys.webhooks(tenant))
        hooks = [json.loads(v) for v in stored.values()]
        return sorted(({k: v for k, v in h.items() if k != "secret"} for h in hooks), key=str)

    async def delete(self, tenant: str, hook_id: str) -> bool:
        return bool(await self.api.aredis.hdel(keys.webhooks(tenant), hook_id))

    # --- delivery ------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name="webhooks")

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
        for task in list(self._deliveries):
            task.cancel()
        if self._deliveries:
            await asyncio.wait(self._deliveries, timeout=5)
        await self.client.aclose()

    async def _run(self) -> None:
        sweep_at = 0.0  # first this consumer's unacknowledged entries, then new ones
        while True:
            try:
                with contextlib.suppress(redis.exceptions.ResponseError):  # BUSYGROUP
                    await self.api.aredis.xgroup_create(keys.RECENT, GROUP, id="$", mkstream=True)
                while True:
                    if time.monotonic() >= sweep_at:
                        for entry_id, fields in await self._unacknowledged():
                            await self._dispatch(entry_id, fields)
                        sweep_at = time.monotonic() + PENDING_SWEEP_S
                    reply = await self.api.aredis.xreadgroup(
                        GROUP, self.consumer, {keys.RECENT: ">"}, count=100, block=BLOCK_SLICE_MS
                    )
                    for _stream, entries in reply or []:
                        for entry_id, fields in entries:
                            await self._dispatch(entry_id, fields)
            except asyncio.CancelledError:
                raise
            except (
                redis.exceptions.RedisError,
                redis.exceptions.RedisClusterException,
                OSError,
            ) as exc:
                log.warning("webhooks: redis unavailable (%s); retrying", type(exc).__name__)
                sweep_at = 0.0  # a read that failed may have been handed entries all the same
                await asyncio.sleep(1.0)

    async def _unacknowledged(self) -> list[tuple[bytes, Any]]:
        """The entries handed to this consumer and never acknowledged, but for those being
        delivered now: handed over by a read whose reply never arrived, delivered before a
        restart, or whose acknowledgement failed. Delivered again: at least once."""
        found: list[tuple[bytes, Any]] = []
        start: bytes | str = "0"
        while True:
            reply = await self.api.aredis.xreadgroup(
                GROUP, self.consumer, {keys.RECENT: start}, count=100
            )
            batch = [(e, f) for _s, entries in reply or [] for e, f in entries]
            if not batch:
                return found
            found += [(e, f) for e, f in batch if e not in self._in_flight]
            start = batch[-1][0]

    async def _dispatch(self, entry_id: bytes, fields: Any) -> None:
        # No fields: the entry was trimmed from cw:recent while it waited; nothing to deliver.
        event = entry_event(entry_id, fields, keys.RECENT) if fields else None
        internal = str((event or {}).get("conversation_id", ""))
        tenant, sep, external = internal.partition(":")
        hooks = []
        if event is not None and sep:
            stored = await self.api.aredis.hgetall(keys.webhooks(tenant))
            hooks = [
                h
                for h in (json.loads(v) for v in stored.values())
                if h.get("conversation_id") in (None, external)
                and (h.get("types") is None or event.get("type") in h["types"])
            ]
        if event is None or not hooks:
            await self.api.aredis.xack(keys.RECENT, GROUP, entry_id)
            return
        body = json.dumps(Tenant(tenant).event(event), ensure_ascii=False).encode()
        reviewers = [h for h in hooks if is_review_hook(h)] if _held(event) else []
        ask = Review(internal, str(event.get("event_id")), reviewers) if reviewers else None
        await self._slots.acquire()
        self._in_flight.add(entry_id)
        task = asyncio.create_task(self._deliver_all(entry_id, hooks, body, ask))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _deliver_all(
        self,
        entry_id: bytes,
        hooks: list[dict[str, Any]],
        body: bytes,
        review: Review | None = None,
    ) -> None:
        asking = review.hooks if review is not None else []
        others = [h for h in hooks if h not in asking]

        async def ask_all() -> list[Answer]:
            if review is None:
                return []
            return list(
                await asyncio.gather(*(self._ask(h, body, review.event_id) for h in asking))
            )

        try:
            answers, _sent = await asyncio.gather(
                ask_all(), asyncio.gather(*(self._deliver(h, body) for h in others))
            )
            if review is not None:
                await self._decide(review, answers)
            await self.api.aredis.xack(keys.RECENT, GROUP, entry_id)
        except (
            redis.exceptions.RedisError,
            redis.exceptions.RedisClusterException,
            OSError,
            RedisUnavailable,  # deciding a held compaction: asked again on the next sweep
        ):
            pass  # not acknowledged: the next sweep of unacknowledged entries delivers it again
        finally:
            self._in_flight.discard(entry_id)
            self._slots.release()

    async def _ask(self, hook: dict[str, Any], body: bytes, event_id: str) -> Answer:
        """Deliver a proposal to a review hook, once, and take its signed answer within
        ``review_deadline_s``; the hook's default when none comes in time or none can be
        taken (a retry would outlast the deadline)."""
        fallback = Answer(hook.get("review_default") or self.config.review_default, "default")
        deadline_s = self.config.review_deadline_s
        try:
            async with asyncio.timeout(deadline_s):
                target = await check_url(hook["url"], allow_private=self.config.allow_private)
                headers = {
                    "Content-Type": "application/json",
                    SIGNATURE_HEADER: sign(hook["secret"], int(time.time()), body),
                    "X-Compactor-Webhook": hook["id"],
                    "X-Compactor-Attempt": "1",
                    "X-Compactor-Review-Deadline": f"{deadline_s:g}",
                }
                reply = await post_pinned(self.client, target, body, headers)
        except (TimeoutError, UnsafeUrl, httpx.HTTPError) as exc:
            log.warning(
                "review hook %s: no answer within %gs (%s); its default: %s",
                hook["id"],
                deadline_s,
                type(exc).__name__,
                fallback.decision,
            )
            return fallback
        answer = read_answer(
            hook["secret"], event_id, reply.status_code, reply.headers, reply.content
        )
        if answer is None:
            log.warning(
                "review hook %s: answered %d without a valid signed decision; its default: %s",
                hook["id"],
                reply.status_code,
                fallback.decision,
            )
            return fallback
        return answer

    async def _decide(self, review: Review, answers: list[Answer]) -> None:
        """Approve or decline the held compaction as the review hooks decided. One decided
        meanwhile (by a person, or another process) is left as it is."""
        answer = decided(answers)
        reviewer = self.api.reviewer
        try:
            if answer.decision == "approve":
                try:
                    await reviewer.approve(
                        review.internal, review.event_id, answer.summary, by=answer.by
                    )
                    return
                except ApiError as exc:
                    if exc.status != 422:
                        raise
                    # The hook asked for changes we cannot take: its edit is not applied, and
                    # neither is the proposal it meant to change.
                    answer = Answer("reject", answer.by, reason=f"edit refused: {exc}")
            await reviewer.decline(review.internal, review.event_id, answer.reason, by=answer.by)
        except ApiError as exc:
            log.info("review hooks: %s not decided by them: %s", review.event_id, exc)

    async def _deliver(self, hook: dict[str, Any], body: bytes) -> bool:
        """POST ``body`` to the hook, retrying with backoff; True once it answered 2xx."""
        delay = self.config.backoff_s
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                target = await check_url(hook["url"], allow_private=self.config.allow_private)
            except UnsafeUrl as exc:
                log.warning("webhook %s refused: %s", hook["id"], exc)
                return False
            timestamp = int(time.time())
            headers = {
                "Content-Type": "application/json",
                SIGNATURE_HEADER: sign(hook["secret"], timestamp, body),
                "X-Compactor-Webhook": hook["id"],
                "X-Compactor-Attempt": str(attempt),
            }
            try:
                reply = await post_pinned(self.client, target, body, headers)
                if 200 <= reply.status_code < 300:
                    return True
                retry = reply.status_code == 429 or reply.status_code >= 500
                outcome = str(reply.status_code)
            except httpx.HTTPError as exc:
                retry, outcome = True, type(exc).__name__
            log.warning("webhook %s attempt %d: %s", hook["id"], attempt, outcome)
            if not retry or attempt == self.config.max_attempts:
                return False
            await asyncio.sleep(min(delay, self.config.backoff_max_s))
            delay *= 2
        return False


# --- review hooks ---------------------------------------------------------------------------

DECISIONS = ("approve", "reject")
# The largest answer read from a review hook (an edited summary is bounded far below it).
MAX_ANSWER_BYTES = 512 * 1024


def is_review_hook(hook: dict[str, Any]) -> bool:
    """A hook that decides held compactions: one subscribed to ``compaction.proposed`` by name
    (a hook of every type only hears of them)."""
    types = hook.get("types")
    return isinstance(types, list) and "compaction.proposed" in types


def _held(event: dict[str, Any]) -> bool:
    return event.get("type") == "compaction.proposed" and isinstance(event.get("event_id"), str)


@dataclass(frozen=True)
class Review:
    """A proposal to put to the review hooks that subscribed to it."""

    internal: str  # the conversation, as the service names it
    event_id: str  # the compaction.proposed event's
    hooks: list[dict[str, Any]]


@dataclass(frozen=True)
class Answer:
    """One review hook's decision: what it answered (``by="webhook"``), or, when it did not
    answer in time or validly, its default (``by="default"``)."""

    decision: str  # approve | reject
    by: str
    summary: str | None = None
    reason: str | None = None


def read_answer(
    secret: str, event_id: str, status: int, headers: httpx.Headers, body: bytes
) -> Answer | None:
    """A review hook's answer, or None when there is none to take: not 2xx, unsigned or
    signed otherwise than with the hook's secret (``X-Compactor-Signature`` over the body,
    as our deliveries are signed), not about this proposal (``event_id``), or malformed."""
    if not 200 <= status < 300 or len(body) > MAX_ANSWER_BYTES:
        return None
    if not verify(secret, headers.get(SIGNATURE_HEADER, ""), body):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("event_id") != event_id:
        return None
    decision, summary, reason = doc.get("decision"), doc.get("summary"), doc.get("reason")
    if decision not in DECISIONS:
        return None
    if not isinstance(summary, str | None) or not isinstance(reason, str | None):
        return None
    try:  # text with control characters is a malformed answer: the hook's default applies
        for field, text in (("summary", summary), ("reason", reason)):
            if text is not None:
                user_text(field, text)
    except InvalidRequest:
        return None
    return Answer(decision, "webhook", summary if decision == "approve" else None, reason)


def decided(answers: list[Answer]) -> Answer:
    """One decision from every review hook's: a reject (a veto) wins; else an approval, with
    the first edited summary any hook sent."""
    vetoes = [a for a in answers if a.decision == "reject"]
    if vetoes:
        return vetoes[0]
    edits = [a for a in answers if a.summary is not None]
    return edits[0] if edits else answers[0]
