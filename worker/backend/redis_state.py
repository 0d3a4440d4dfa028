"""The service's state in Redis: claim-checked snapshots, coalescing, the single-flight lock,
events, reviews and the idle scan (:class:`RedisState`).

The multi-step updates that must be atomic are Lua scripts (:mod:`worker.backend.scripts`): a
submission records its payload and the conversation's newest revision together; publishing
checks the fencing token, de-duplicates by event id and appends to the stream in one step, so a
worker that lost its lease can never publish. Every redis-py exception is converted by
:func:`worker.backend.connection.redis_errors`; the connections themselves are made in
:mod:`worker.backend.connection`, streams are read with :mod:`worker.backend.streams`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar

import redis

from worker.backend import keys, scripts
from worker.backend.connection import redis_errors
from worker.backend.streams import (
    as_text,
    block_slices,
    entry_event,
    newest_id_of,
    stream_entries,
)
from worker.config import RedisConfig
from worker.core.cost import Activity
from worker.core.review import with_edited_counts
from worker.errors import LeaseLost, NoSnapshot, RedisUnavailable, TransientError
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
# How long a release's answer is remembered for the same release run again after its reply was
# lost: the client's retries end within seconds (worker.backend.connection).
LOCK_REPLY_TTL_MS = 60_000

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
class Released:
    """What releasing a conversation's lock found waiting: a snapshot that came while it was
    held (``rerun``), a compaction on demand (``requested``)."""

    rerun: bool = False
    requested: bool = False


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
        self.scripts = scripts.Scripts(client)

    # --- snapshots ---------------------------------------------------------------------------

    def store_snapshot(
        self, conversation_id: str, revision: int, payload: bytes, *, submission: str = ""
    ) -> SubmitResult:
        """Claim check: the payload stays in Redis; the broker message carries only ids.
        ``submission``: this submission's id (a fresh one when empty), which the queued flag
        holds: a script run again after its reply was lost (redis-py retries a command whose
        connection broke, and the command may have run) answers ``queued`` again rather than
        coalescing into its own flag, whose evaluation was never sent."""
        ttl = self.config.snapshot_ttl_s
        submission = submission or uuid.uuid4().hex
        packed = zlib.compress(payload, 1)
        now = time.time()
        with redis_errors("storing a snapshot"):
            # Pending before the snapshot exists (a crash after this leaves an entry the
            # reconciler settles), and again after it: a publish may have removed the entry
            # in between, having seen the older revision as the newest (keys.py).
            self.client.zadd(keys.PENDING, {conversation_id: now}, nx=True)
            status, rev = self.scripts.run(
                scripts.submit(
                    conversation_id,
                    payload=packed,
                    revision=revision,
                    ttl_s=ttl,
                    submission=submission,
                )
            )
            pipe = self.client.pipeline(transaction=False)
            if as_text(status) != "superseded":
                pipe.zadd(keys.PENDING, {conversation_id: now}, nx=True)
                self._note_activity(pipe, conversation_id, now)
            self._touch_tenant(pipe, conversation_id, now)
            pipe.execute()
        return SubmitResult(status=as_text(status), revision=int(rev))  # type: ignore[arg-type]

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

    def unqueue(self, conversation_id: str, submission: str) -> bool:
        """Clear the queued flag that ``store_snapshot`` set for ``submission`` (its task
        could not be sent), if it is still that one's; whether it was cleared."""
        with redis_errors("clearing the queued flag"):
            cleared = self.scripts.run(scripts.unqueue(conversation_id, submission=submission))
        return bool(cleared)

    def take_work(self, conversation_id: str, *, known_memo: str = "", idle: bool = False) -> Work:
        """In one round trip: clear the queued flag (later submissions enqueue afresh), and read
        the newest and handled revisions, the newest snapshot, the recent compactions, the
        evaluation memo (its bytes only when its digest is not ``known_memo``) and the
        conversation's pace. ``idle``: the work of an idle compaction, whose newest revision
        has an outcome already (then no work when one is still pending, and the queued flag
        is left as it is)."""
        with redis_errors("reading the conversation's work"):
            reply = self.scripts.run(
                scripts.take(conversation_id, known_memo=known_memo, idle=idle)
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
            memo_digest=as_text(reply[4]) if reply[4] else None,
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
            reply = self.scripts.run(
                scripts.request(
                    conversation_id, request=request.to_json(), ttl_s=self.config.snapshot_ttl_s
                )
            )
        if as_text(reply[0]) == "no_snapshot":
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
            reply = self.scripts.run(scripts.take_request(conversation_id))
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
            self.scripts.run(scripts.done_request(conversation_id, request_id=request_id))

    def acquire_lock(
        self, conversation_id: str, lease_s: float, *, unless_handled: int | None = None
    ) -> LockClaim:
        """Take the conversation's lock for ``lease_s``, with a fresh fencing token, unless
        another worker holds it or, with ``unless_handled``, that revision has an outcome
        already: both checked in the same step as the taking."""
        with redis_errors("taking the conversation lock"):
            reply = self.scripts.run(
                scripts.acquire(
                    conversation_id,
                    lease_ms=int(lease_s * 1000),
                    fence_ttl_s=self.config.stream_ttl_s,
                    unless_handled=unless_handled,
                    claim=uuid.uuid4().hex,
                )
            )
        status = as_text(reply[0])
        token = as_text(reply[1]) if status == "taken" else None
        return LockClaim(status=status, token=token)  # type: ignore[arg-type]

    def renew_lock(self, conversation_id: str, token: str, lease_s: float) -> bool:
        with redis_errors("renewing the conversation lock"):
            renewed = self.scripts.run(
                scripts.renew(conversation_id, token=token, lease_ms=int(lease_s * 1000))
            )
        return bool(renewed)

    def release_lock(
        self, conversation_id: str, token: str, *, taken_request: str = ""
    ) -> Released:
        """Release the lock (while ``token`` still holds it) and take the re-run flag in the
        same step: :attr:`Released.rerun`, a snapshot came while it was held
        (:meth:`defer_to_holder`), evaluate again. While another worker holds the lock, the
        flag is left for that one. Also says whether a compaction on demand waits
        (:attr:`Released.requested`) other than ``taken_request`` (the id of the one the
        holder took itself)."""
        with redis_errors("releasing the conversation lock"):
            reply = self.scripts.run(
                scripts.release(
                    conversation_id,
                    token=token,
                    taken_request=taken_request,
                    reply_ttl_ms=LOCK_REPLY_TTL_MS,
                )
            )
        return Released(rerun=bool(reply[1]), requested=bool(reply[2]))

    def lock_ttl_s(self, conversation_id: str) -> float:
        """Seconds left on the conversation's lock lease; 0 when nobody holds it."""
        with redis_errors("checking the conversation lock"):
            ms = int(self.client.pttl(keys.lock(conversation_id)))
        return max(ms, 0) / 1000

    def defer_to_holder(self, conversation_id: str) -> float:
        """While another worker holds the conversation's lock, flag a re-run that its release
        takes (one step with reading the lease: it cannot release in between) and return the
        seconds left on its lease; 0, flagging nothing, when nobody holds it."""
        with redis_errors("flagging a re-evaluation"):
            ms = self.scripts.run(scripts.defer(conversation_id, ttl_s=self.config.snapshot_ttl_s))
        return max(int(ms), 0) / 1000

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
            reply = self.scripts.run(
                scripts.publish(
                    self.config,
                    conv,
                    [(e.event_id, text) for e, text in zip(events, texts, strict=True)],
                    fencing_token=fencing_token or "",
                    handled_revision=handled_revision,
                    is_completed=is_completed,
                    last_count=LAST_COMPACTIONS,
                    memo=memo or b"",
                    memo_digest=memo_digest,
                    composed=composed.to_json() if composed is not None and is_completed else "",
                    dedup_ttl_s=dedup_ttl_s or self.config.stream_ttl_s,
                    proposal=proposal.to_json() if proposal is not None else "",
                )
            )
        if as_text(reply[0]) == "lease_lost":
            raise LeaseLost(f"lost the lock on {conv} before publishing; not published")
        newest, statuses = int(reply[0]), [as_text(s) for s in reply[1:]]
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
                reply = self.scripts.run(
                    scripts.revert(
                        self.config,
                        conversation_id,
                        reverted_id=event_id,
                        composed_now=stored or b"",
                        composed_before="" if back is None else back.to_json(),
                        event_id=event.event_id,
                        event=event.to_json(),
                    )
                )
            status, stream_id = as_text(reply[0]), as_text(reply[1])
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
        if summary is not None:
            event = with_edited_counts(event, proposal.compaction)
        composed = held.composed
        if composed is not None:
            composed = approved_composition(
                composed, event.event_id, proposal.compaction.summary.text, summary
            )
        with redis_errors("approving a compaction"):
            reply = self.scripts.run(
                scripts.approve(
                    self.config,
                    conv,
                    proposal_id=proposal.event_id,
                    base_id=held.base or "",
                    event_id=event.event_id,
                    event=event.to_json(),
                    composed="" if composed is None else composed.to_json(),
                    last_count=LAST_COMPACTIONS,
                )
            )
        status, stream_id = as_text(reply[0]), as_text(reply[1])
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
            reply = self.scripts.run(
                scripts.decline(
                    self.config,
                    conv,
                    proposal_id=held.event.event_id,
                    event_id=event.event_id,
                    event=event.to_json(),
                )
            )
        status, stream_id = as_text(reply[0]), as_text(reply[1])
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
            return newest_id_of(self.client.xrevrange(keys.events(conversation_id), count=1))

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
        return [as_text(m) for m in members]

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
        with redis_errors("reading idle conversations"):
            due = self.client.zrangebyscore(
                keys.IDLE_TENANTS, "-inf", idle_since, start=0, num=tenants
            )
            names = [as_text(t) for t in due]
            taken: list[list[Any]] = []
            for start in range(0, len(names), _IDLE_TENANTS_PER_CALL):
                call = scripts.take_idle(
                    names[start : start + _IDLE_TENANTS_PER_CALL],
                    idle_since=idle_since,
                    expired_before=now - self.config.snapshot_ttl_s,  # older entries dropped
                    busy_since=now - busy_for_s,  # lost: older hand-outs are forgotten
                    per_tenant=per_tenant,
                    now=now,
                    busy_ttl_s=math.ceil(busy_for_s),
                    scan_left=len(names) - start,
                )
                taken += self.scripts.run(call)
        return [as_text(c) for c in _interleaved(taken)]

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
        return {as_text(k): float(v) for k, v in raw.items()}


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
