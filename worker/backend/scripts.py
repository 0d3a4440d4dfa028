"""The state's Lua scripts (``worker/backend/lua/*.lua``, shipped as package data) and, for each,
the one place that lays out its KEYS and ARGV.

Every script opens by naming its keys and arguments (``local events_key = KEYS[1]``,
``local last_count = tonumber(ARGV[7])``) and reads them by those names only. The builder of
the same name here returns a :class:`Call` holding them under the same names, in the same
order, built from named values: a position cannot drift between the two sides without
tests/integration/test_redis_scripts.py, which reads the Lua's names and compares, failing.

Every script touches one conversation's keys only, all passed in KEYS and all in the slot of
the conversation's hash tag (:mod:`worker.backend.keys`): on a Redis Cluster each runs on one
node. The global keys (cw:pending, cw:recent, cw:metrics) are written around the scripts; the
idle scan's keys share the hash tag ``.idle``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from worker.backend import keys
from worker.config import RedisConfig

#: Every script, by the name of its file in ``lua/``.
NAMES = (
    "submit",
    "unqueue",
    "publish",
    "approve",
    "decline",
    "revert",
    "take",
    "acquire",
    "renew",
    "release",
    "defer",
    "request",
    "take_request",
    "done_request",
    "take_idle",
)

Arg = str | bytes | int | float


def source(name: str) -> str:
    """The text of script ``name`` (``lua/<name>.lua``), from the installed package."""
    return resources.files("worker.backend").joinpath("lua", f"{name}.lua").read_text("utf-8")


@dataclass(frozen=True)
class Call:
    """One run of a script: its KEYS and ARGV under the names the script gives them, in its
    order, then the variable-length tails some scripts read from a named position on."""

    script: str
    keys: dict[str, str]
    args: dict[str, Arg] = field(default_factory=dict)
    keys_tail: tuple[str, ...] = ()
    args_tail: tuple[Arg, ...] = ()

    def key_list(self) -> list[str]:
        return [*self.keys.values(), *self.keys_tail]

    def arg_list(self) -> list[Arg]:
        return [*self.args.values(), *self.args_tail]


class Scripts:
    """Every script registered on one client: run by EVALSHA, loaded again by redis-py when
    Redis answers NOSCRIPT (a restart, a failover)."""

    def __init__(self, client: Any) -> None:
        self._registered = {name: client.register_script(source(name)) for name in NAMES}

    def run(self, call: Call) -> Any:
        return self._registered[call.script](keys=call.key_list(), args=call.arg_list())


def submit(
    conversation_id: str, *, payload: bytes, revision: int, ttl_s: int, submission: str
) -> Call:
    c = conversation_id
    return Call(
        "submit",
        keys={
            "snapshot_key": keys.snapshot(c),
            "latest_key": keys.latest(c),
            "queued_key": keys.queued(c),
            "handled_key": keys.handled(c),
        },
        args={"payload": payload, "revision": revision, "ttl_s": ttl_s, "submission": submission},
    )


def unqueue(conversation_id: str, *, submission: str) -> Call:
    return Call(
        "unqueue",
        keys={"queued_key": keys.queued(conversation_id)},
        args={"submission": submission},
    )


def publish(
    config: RedisConfig,
    conversation_id: str,
    events: Sequence[tuple[str, str]],
    *,
    fencing_token: str,
    handled_revision: int | None,
    is_completed: bool,
    last_count: int,
    memo: bytes,
    memo_digest: str,
    composed: str,
    dedup_ttl_s: int,
    proposal: str,
) -> Call:
    """``events``: (event id, JSON) of each event to publish, the outcome last."""
    c = conversation_id
    return Call(
        "publish",
        keys={
            "events_key": keys.events(c),
            "lock_key": keys.lock(c),
            "handled_key": keys.handled(c),
            "last_key": keys.last_compaction(c),
            "latest_key": keys.latest(c),
            "memo_key": keys.memo(c),
            "composed_key": keys.composed(c),
            "proposal_key": keys.proposal(c),
        },
        keys_tail=tuple(keys.published(c, event_id) for event_id, _ in events),
        args={
            "fencing_token": fencing_token,
            "handled_revision": "" if handled_revision is None else handled_revision,
            "stream_ttl_s": config.stream_ttl_s,
            "stream_maxlen": config.stream_maxlen,
            "announce_channel": keys.announce(c),
            "is_completed": "1" if is_completed else "0",
            "last_count": last_count,
            "memo": memo,
            "memo_ttl_s": config.snapshot_ttl_s,
            "memo_digest": memo_digest,
            "composed": composed,
            "dedup_ttl_s": dedup_ttl_s,
            "proposal": proposal,
        },
        args_tail=tuple(text for _, text in events),
    )


def approve(
    config: RedisConfig,
    conversation_id: str,
    *,
    proposal_id: str,
    base_id: str,
    event_id: str,
    event: str,
    composed: str,
    last_count: int,
) -> Call:
    c = conversation_id
    return Call(
        "approve",
        keys={
            "proposal_key": keys.proposal(c),
            "last_key": keys.last_compaction(c),
            "composed_key": keys.composed(c),
            "events_key": keys.events(c),
            "published_key": keys.published(c, event_id),
        },
        args={
            "proposal_id": proposal_id,
            "base_id": base_id,
            "event": event,
            "composed": composed,
            "stream_maxlen": config.stream_maxlen,
            "stream_ttl_s": config.stream_ttl_s,
            "announce_channel": keys.announce(c),
            "last_count": last_count,
        },
    )


def decline(
    config: RedisConfig, conversation_id: str, *, proposal_id: str, event_id: str, event: str
) -> Call:
    c = conversation_id
    return Call(
        "decline",
        keys={
            "proposal_key": keys.proposal(c),
            "events_key": keys.events(c),
            "published_key": keys.published(c, event_id),
        },
        args={
            "proposal_id": proposal_id,
            "event": event,
            "stream_maxlen": config.stream_maxlen,
            "stream_ttl_s": config.stream_ttl_s,
            "announce_channel": keys.announce(c),
        },
    )


def revert(
    config: RedisConfig,
    conversation_id: str,
    *,
    reverted_id: str,
    composed_now: bytes,
    composed_before: str,
    event_id: str,
    event: str,
) -> Call:
    c = conversation_id
    return Call(
        "revert",
        keys={
            "last_key": keys.last_compaction(c),
            "composed_key": keys.composed(c),
            "lock_key": keys.lock(c),
            "events_key": keys.events(c),
            "published_key": keys.published(c, event_id),
        },
        args={
            "reverted_id": reverted_id,
            "composed_now": composed_now,
            "composed_before": composed_before,
            "event": event,
            "stream_maxlen": config.stream_maxlen,
            "stream_ttl_s": config.stream_ttl_s,
            "announce_channel": keys.announce(c),
        },
    )


def take(conversation_id: str, *, known_memo: str, idle: bool) -> Call:
    c = conversation_id
    return Call(
        "take",
        keys={
            "queued_key": keys.queued(c),
            "latest_key": keys.latest(c),
            "handled_key": keys.handled(c),
            "last_key": keys.last_compaction(c),
            "memo_key": keys.memo(c),
            "snapshot_key": keys.snapshot(c),
            "composed_key": keys.composed(c),
            "proposal_key": keys.proposal(c),
            "activity_key": keys.activity(c),
        },
        args={"known_memo": known_memo, "idle": "1" if idle else ""},
    )


def acquire(
    conversation_id: str,
    *,
    lease_ms: int,
    fence_ttl_s: int,
    unless_handled: int | None,
    claim: str,
) -> Call:
    c = conversation_id
    return Call(
        "acquire",
        keys={
            "lock_key": keys.lock(c),
            "fence_key": keys.fence(c),
            "handled_key": keys.handled(c),
            "reply_key": keys.lock_reply(c),
        },
        args={
            "lease_ms": lease_ms,
            "fence_ttl_s": fence_ttl_s,
            "unless_handled": "" if unless_handled is None else unless_handled,
            "claim": claim,
        },
    )


def renew(conversation_id: str, *, token: str, lease_ms: int) -> Call:
    return Call(
        "renew",
        keys={"lock_key": keys.lock(conversation_id)},
        args={"token": token, "lease_ms": lease_ms},
    )


def release(
    conversation_id: str, *, token: str, taken_request: str = "", reply_ttl_ms: int
) -> Call:
    c = conversation_id
    return Call(
        "release",
        keys={
            "lock_key": keys.lock(c),
            "rerun_key": keys.rerun(c),
            "requested_key": keys.requested(c),
            "reply_key": keys.lock_reply(c),
        },
        args={"token": token, "taken_request": taken_request, "reply_ttl_ms": reply_ttl_ms},
    )


def defer(conversation_id: str, *, ttl_s: int) -> Call:
    c = conversation_id
    return Call(
        "defer", keys={"lock_key": keys.lock(c), "rerun_key": keys.rerun(c)}, args={"ttl_s": ttl_s}
    )


def request(conversation_id: str, *, request: str, ttl_s: int) -> Call:
    c = conversation_id
    return Call(
        "request",
        keys={"requested_key": keys.requested(c), "latest_key": keys.latest(c)},
        args={"request": request, "ttl_s": ttl_s},
    )


def take_request(conversation_id: str) -> Call:
    c = conversation_id
    return Call(
        "take_request",
        keys={
            "requested_key": keys.requested(c),
            "latest_key": keys.latest(c),
            "snapshot_key": keys.snapshot(c),
            "last_key": keys.last_compaction(c),
            "composed_key": keys.composed(c),
            "proposal_key": keys.proposal(c),
        },
    )


def done_request(conversation_id: str, *, request_id: str) -> Call:
    return Call(
        "done_request",
        keys={"requested_key": keys.requested(conversation_id)},
        args={"request_id": request_id},
    )


def take_idle(
    tenants: Sequence[str],
    *,
    idle_since: float,
    expired_before: float,
    busy_since: float,
    per_tenant: int,
    now: float,
    busy_ttl_s: int,
    scan_left: int,
) -> Call:
    """``scan_left``: how many tenants the scan looks at from ``tenants[0]`` on (this call's
    and the later calls'). The times go as ``repr`` strings: every digit of a score kept."""
    return Call(
        "take_idle",
        keys={"tenants_key": keys.IDLE_TENANTS},
        keys_tail=tuple(
            key for t in tenants for key in (keys.idle_conversations(t), keys.idle_busy(t))
        ),
        args={
            "idle_since": repr(idle_since),
            "expired_before": repr(expired_before),
            "busy_since": repr(busy_since),
            "per_tenant": per_tenant,
            "now": repr(now),
            "busy_ttl_s": busy_ttl_s,
            "scan_left": scan_left,
        },
        args_tail=tuple(tenants),
    )
