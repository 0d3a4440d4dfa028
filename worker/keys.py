"""Every Redis key the service uses, built in one place, with its owner and lifetime.

docs/redis-protocol.md documents them for other programs, with what each key holds.

All keys share the ``cw:`` prefix (one Redis can serve other applications too). Conversation
ids are validated before they get here (1-128 of ``A-Za-z0-9._:-``), so keys cannot collide.

| key | type | written by | lifetime |
|---|---|---|---|
| ``cw:snap:{conv}:{rev}`` | string (zlib JSON) | submit | ``snapshot_ttl_s``, or a newer one |
| ``cw:latest:{conv}`` | string (int) | submit (max only) | ``snapshot_ttl_s``, renewed by submit |
| ``cw:handled:{conv}`` | string (int) | evaluate | ``stream_ttl_s`` |
| ``cw:queued:{conv}`` | string flag | submit (NX) / evaluate (DEL) | ``snapshot_ttl_s`` |
| ``cw:lock:{conv}`` | string (fencing token) | summarize | lease (``lock_lease_s``), renewed |
| ``cw:fence:{conv}`` | string (int counter) | summarize | ``stream_ttl_s`` |
| ``cw:rerun:{conv}`` | string flag | evaluate while locked | ``snapshot_ttl_s`` |
| ``cw:memo:{conv}`` | hash: ``d`` digest, ``b`` JSON | evaluate (skipped) | ``snapshot_ttl_s`` |
| ``cw:last:{conv}`` | list (event JSON, newest 8) | publish (completed) | ``stream_ttl_s`` |
| ``cw:events:{conv}`` | stream | publish | MAXLEN ``stream_maxlen``, ``stream_ttl_s`` |
| ``cw:published:{event_id}`` | string flag | publish (NX) | ``stream_ttl_s`` (see below) |
| ``cw:announce:{conv}`` | pub/sub channel | publish | none (not stored) |
| ``cw:proxyrev:{conv}`` | string (int counter) | the HTTP proxy (INCR) | ``stream_ttl_s`` |
| ``cw:webhooks:{tenant}`` | hash id -> JSON | ``POST /v1/webhooks`` | until deleted |
| ``cw:recent`` | stream (all conversations) | publish | MAXLEN 1000 |
| ``cw:pending`` | zset conv -> submit time (*) | submit, publish, reconcile | until handled |
| ``cw:metrics`` | hash of counters | everyone | none (counters) |

(*) The reconciler moves a score it acts on: to now when it re-queues the conversation, and for a
conversation whose lock lease is alive to the time at which that lease would lapse (minus
``reconcile_after_s``), so it is looked at again then and not on every run.

The events of an evaluation that ends in ``compaction.skipped`` (that one, and its
``tool_results.elided``) keep their ``cw:published`` flag only as long as a redelivery of that
evaluation can come (two visibility timeouts plus the reconciler's delay and the evaluate time
limit), not ``stream_ttl_s``: at a million evaluations a day, a week of flags would be seven
million keys. Over the threshold the revision stays pending until its compaction, so its
elided event keeps ``stream_ttl_s``.
"""

from __future__ import annotations

PREFIX = "cw:"
REJECTED_CONVERSATION = "_rejected"  # events for snapshots whose own id is invalid


def snapshot(conversation_id: str, revision: int) -> str:
    return f"{PREFIX}snap:{conversation_id}:{revision}"


def latest(conversation_id: str) -> str:
    return f"{PREFIX}latest:{conversation_id}"


def handled(conversation_id: str) -> str:
    return f"{PREFIX}handled:{conversation_id}"


def queued(conversation_id: str) -> str:
    return f"{PREFIX}queued:{conversation_id}"


def lock(conversation_id: str) -> str:
    return f"{PREFIX}lock:{conversation_id}"


def fence(conversation_id: str) -> str:
    return f"{PREFIX}fence:{conversation_id}"


def rerun(conversation_id: str) -> str:
    return f"{PREFIX}rerun:{conversation_id}"


def memo(conversation_id: str) -> str:
    return f"{PREFIX}memo:{conversation_id}"


def last_compaction(conversation_id: str) -> str:
    return f"{PREFIX}last:{conversation_id}"


def events(conversation_id: str) -> str:
    return f"{PREFIX}events:{conversation_id}"


def published(event_id: str) -> str:
    return f"{PREFIX}published:{event_id}"


def announce(conversation_id: str) -> str:
    return f"{PREFIX}announce:{conversation_id}"


def proxy_revision(conversation_id: str) -> str:
    """The revision counter of the snapshots the HTTP proxy submits for a conversation."""
    return f"{PREFIX}proxyrev:{conversation_id}"


def webhooks(tenant: str) -> str:
    """A tenant's webhook registrations (``compactor serve``)."""
    return f"{PREFIX}webhooks:{tenant}"


RECENT = f"{PREFIX}recent"
PENDING = f"{PREFIX}pending"
METRICS = f"{PREFIX}metrics"
