"""Every Redis key the service uses, built in one place, with its owner and lifetime.

docs/redis-protocol.md documents them for other programs, with what each key holds.

All keys share the ``cw:`` prefix (one Redis can serve other applications too). Conversation
ids are validated before they get here (1-128 of ``A-Za-z0-9._:-``), so keys cannot collide.

**Key layout 2** (:data:`LAYOUT`). Every key of a conversation carries the conversation id as
a Redis Cluster *hash tag*, ``cw:{<conv>}:...`` (an id never contains a brace), so all of them
live in one hash slot and every Lua script, which only ever touches one conversation, runs on
one node. One layout for every deployment: a standalone Redis or Sentinel-managed one ignores
the braces. Layout 1 (``cw:snap:<conv>:<rev>``, ...) is not read any more.

| key | type | written by | lifetime |
|---|---|---|---|
| ``cw:{conv}:snapshot`` | string (zlib JSON) | submit | ``snapshot_ttl_s`` (newest revision only) |
| ``cw:{conv}:latest`` | string (int) | submit (max only) | ``snapshot_ttl_s``, renewed by submit |
| ``cw:{conv}:handled`` | string (int) | evaluate | ``stream_ttl_s`` |
| ``cw:{conv}:queued`` | string flag | submit (NX) / evaluate (DEL) | ``snapshot_ttl_s`` |
| ``cw:{conv}:lock`` | string (fencing token) | summarize | lease (``lock_lease_s``), renewed |
| ``cw:{conv}:lockreply`` | string | taking and releasing the lock | the lease; 60 s |
| ``cw:{conv}:fence`` | string (int counter) | summarize | ``stream_ttl_s`` |
| ``cw:{conv}:rerun`` | string flag | evaluate while locked / release (DEL) | ``snapshot_ttl_s`` |
| ``cw:{conv}:memo`` | hash: ``d`` digest, ``b`` JSON | evaluate (skipped) | ``snapshot_ttl_s`` |
| ``cw:{conv}:last`` | list (event JSON, newest 8) | publish (completed) | ``stream_ttl_s`` |
| ``cw:{conv}:composed`` | string (JSON, wire.composed) | publish (completed) | ``stream_ttl_s`` |
| ``cw:{conv}:proposal`` | string (JSON) | publish (proposed), approve, decline | ``stream_ttl_s`` |
| ``cw:{conv}:events`` | stream | publish | MAXLEN ``stream_maxlen``, ``stream_ttl_s`` |
| ``cw:{conv}:published:{event_id}`` | string flag | publish (NX) | ``stream_ttl_s`` (see below) |
| ``cw:{conv}:announce`` | pub/sub channel | publish | none (not stored) |
| ``cw:{conv}:requested`` | string (JSON) | compact_now | ``snapshot_ttl_s``; deleted when done |
| ``cw:{conv}:activity`` | hash: ``f``, ``t`` submit times, ``n`` | submit | ``snapshot_ttl_s`` |
| ``cw:{conv}:proxyrev`` | string (int counter) | the HTTP proxy (INCR) | ``stream_ttl_s`` |
| ``cw:webhooks:{tenant}`` | hash id -> JSON | ``POST /v1/webhooks`` | until deleted |
| ``cw:tenant:{tenant}:conversations`` | zset conv -> time | submit, publish | ``stream_ttl_s`` |
| ``cw:ui:session:{digest}`` | string (JSON) | the inspector's login | 8 hours, or logout |
| ``cw:recent`` | stream (all conversations) | publish (after the script) | MAXLEN 1000 |
| ``cw:pending`` | zset conv -> submit time (*) | submit, publish, reconcile | until handled |
| ``cw:{.idle}:tenants`` | zset tenant -> when due | submit, idle scan | (**) |
| ``cw:{.idle}:conversations:<tenant>`` | zset conv -> submit time | submit, idle scan | (**) |
| ``cw:{.idle}:busy:<tenant>`` | zset conv -> hand-out time | idle scan, idle compaction | (**) |
| ``cw:metrics`` | hash of counters and histogram buckets | everyone | none (a fixed set) |

**The global keys** (``cw:recent``, ``cw:pending``, ``cw:metrics``, the idle index, and the
per-tenant ``cw:tenant:{tenant}:conversations``, whose member is the internal id ``tenant:conv``)
each live in some slot of their own, so no script or transaction that touches a conversation
touches them: they are written by separate commands, ordered so that a crash between two of
them leaves nothing lost, only work the reconciler does once more:

- submit: ``ZADD NX cw:pending`` *before* the submit script (a crash after it leaves an entry
  that the reconciler settles) and again *after* it (so that a publish that removed the entry
  meanwhile, having seen the older revision, cannot leave the new one unreconciled);
- publish and settle: ``ZREM cw:pending`` only once the script has seen the revision is the
  newest, then ``GET cw:{conv}:latest`` again and put the entry back if a newer one came;
- submit and publish put the conversation first in its tenant's index
  (``cw:tenant:{tenant}:conversations``: ``ZADD``, trimmed to the newest 10,000, expiring with
  ``stream_ttl_s``) after the script, in the round trip of their other global commands; a
  conversation whose id has no tenant prefix is in no index;
- publish appends to ``cw:recent`` and adds its counters to ``cw:metrics`` right after the
  script said ``published``. A worker killed in between (microseconds) leaves the event in its
  conversation's stream but not in ``cw:recent`` (so no webhook) and its counters uncounted.

(**) **The idle index** is one index per tenant (``<tenant>``: the id's part before its first
``:``, ``-`` for an id without one), so that one tenant's backlog holds up no other tenant.
Its keys share the hash tag ``.idle``, which no conversation id can be (none starts with a dot):
one slot, so the scan's script reads the tenant list and the tenants' indexes together and
takes atomically. A submission adds the conversation to its tenant's index (trimmed to the
newest 100,000, expiring ``snapshot_ttl_s`` after the tenant's last submission), then drops
from ``cw:{.idle}:tenants`` the tenants scored more than ``snapshot_ttl_s`` ago (only a list
that no scan reads gets that old) and adds its tenant (``ZADD LT``). A tenant's score is at
most the time of its oldest entry, or, after a scan that left it entries already due, just
under that scan's cut-off: behind the tenants due longer. The scan takes out what it hands to
an idle compaction, drops entries older than ``snapshot_ttl_s`` (their snapshot is gone) and a
tenant whose index it emptied; a submission puts a conversation back. A tenant's ``busy`` set
holds what was handed out and has not ended (at most
:data:`worker.backend.redis_state.IDLE_PER_TENANT`): an idle compaction removes its own entry
when it ends, and the scan forgets one older than a lost task could be (the broker's
visibility timeout plus the summarize time limit, 25 minutes by default; the key expires then
too).

(*) The reconciler moves a score it acts on: to now when it re-queues the conversation, and for a
conversation whose lock lease is alive to the time at which that lease would lapse (minus
``reconcile_after_s``), so it is looked at again then and not on every run.

The events of an evaluation that ends in ``compaction.skipped`` (that one, and its
``tool_results.elided``) keep their ``published`` flag only as long as a redelivery of that
evaluation can come (two visibility timeouts plus the reconciler's delay and the evaluate time
limit), not ``stream_ttl_s``: at a million evaluations a day, a week of flags would be seven
million keys. Over the threshold the revision stays pending until its compaction, so its
elided event keeps ``stream_ttl_s``.
"""

from __future__ import annotations

__all__ = [
    "IDLE_TENANTS",
    "LAYOUT",
    "METRICS",
    "PENDING",
    "PREFIX",
    "RECENT",
    "REJECTED_CONVERSATION",
    "activity",
    "announce",
    "composed",
    "events",
    "fence",
    "handled",
    "idle_busy",
    "idle_conversations",
    "last_compaction",
    "latest",
    "lock",
    "lock_reply",
    "memo",
    "proposal",
    "proxy_revision",
    "published",
    "queued",
    "requested",
    "rerun",
    "snapshot",
    "tenant_conversations",
    "ui_session",
    "webhooks",
]

PREFIX = "cw:"
LAYOUT = 2  # docs/redis-protocol.md#key-layout: bumped whenever a key's name or type changes
REJECTED_CONVERSATION = "_rejected"  # events for snapshots whose own id is invalid


def _conversation_key(conversation_id: str, name: str) -> str:
    """``cw:{<conv>}:<name>``: the braces make the id the key's hash tag (one slot each)."""
    return f"{PREFIX}{{{conversation_id}}}:{name}"


def snapshot(conversation_id: str) -> str:
    """The payload of the conversation's newest revision (``latest``); older ones are gone."""
    return _conversation_key(conversation_id, "snapshot")


def latest(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "latest")


def handled(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "handled")


def queued(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "queued")


def lock(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "lock")


def lock_reply(conversation_id: str) -> str:
    """The lock's last taking or release and what it answered: a script run again after its
    reply was lost answers as its first run did."""
    return _conversation_key(conversation_id, "lockreply")


def fence(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "fence")


def rerun(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "rerun")


def memo(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "memo")


def last_compaction(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "last")


def composed(conversation_id: str) -> str:
    """Every completed compaction as one edit of the full history (worker.wire.composed): what a
    snapshot or proxied request that holds the full history needs, however many compactions
    there were. Its size is bounded by one compaction's replacement, never by the history."""
    return _conversation_key(conversation_id, "composed")


def requested(conversation_id: str) -> str:
    """The compaction someone asked for and no worker has published yet (one per
    conversation: a newer request replaces a waiting one)."""
    return _conversation_key(conversation_id, "requested")


def proposal(conversation_id: str) -> str:
    """The compaction held for review (``compaction.proposed``), if any: at most one per
    conversation; while it waits, no other compaction of the conversation is made."""
    return _conversation_key(conversation_id, "proposal")


def events(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "events")


def published(conversation_id: str, event_id: str) -> str:
    return _conversation_key(conversation_id, f"published:{event_id}")


def announce(conversation_id: str) -> str:
    return _conversation_key(conversation_id, "announce")


def activity(conversation_id: str) -> str:
    """The conversation's pace for the cost model (worker.core.cost): when its first and
    newest snapshots were submitted, and how many there were."""
    return _conversation_key(conversation_id, "activity")


def proxy_revision(conversation_id: str) -> str:
    """The revision counter of the snapshots the HTTP proxy submits for a conversation."""
    return _conversation_key(conversation_id, "proxyrev")


def webhooks(tenant: str) -> str:
    """A tenant's webhook registrations (``compactor serve``); only ever read on its own."""
    return f"{PREFIX}webhooks:{tenant}"


RECENT = f"{PREFIX}recent"
PENDING = f"{PREFIX}pending"
METRICS = f"{PREFIX}metrics"
# The idle index (see (**) above): every key of it in the slot of the hash tag ``.idle``.
_IDLE = f"{PREFIX}{{.idle}}:"
# Tenants whose idle index holds a conversation, by when the scan should look at them next.
IDLE_TENANTS = f"{_IDLE}tenants"


def idle_conversations(tenant: str) -> str:
    """A tenant's conversations by the time of their newest snapshot: what the idle scan
    takes from, oldest first."""
    return f"{_IDLE}conversations:{tenant}"


def idle_busy(tenant: str) -> str:
    """A tenant's conversations handed to an idle compaction that has not ended yet, by when
    they were handed out: what bounds the tenant's share of the workers."""
    return f"{_IDLE}busy:{tenant}"


def tenant_conversations(tenant: str) -> str:
    """A tenant's conversations by last activity (the inspector's and ``GET /v1/conversations``'
    index): member the internal id, score the time of its newest submit or publish."""
    return f"{PREFIX}tenant:{tenant}:conversations"


def ui_session(digest: str) -> str:
    """An inspector login (``compactor serve``'s ``/ui``), by the sha256 of its session id: the
    id itself is only ever in the browser's cookie."""
    return f"{PREFIX}ui:session:{digest}"
