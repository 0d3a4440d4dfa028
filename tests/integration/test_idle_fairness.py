"""Idle compaction is fair across tenants, and a scan's work does not grow with the index.

One tenant with 100,000 idle conversations (as many as the single index of old held, filled
with a pipeline) must not hold up another tenant's: each scan looks at the tenants due longest
first and takes each one's oldest conversations in turns, at most ``IDLE_PER_TENANT`` handed out
per tenant at once. The index is tested on a real Redis, standalone and a 3-master Redis Cluster
(which refuses a script whose keys are in two slots); the guarantee end to end with real Celery
workers and the real scheduler (``celery beat``). Times are asserted as order, and in scan
intervals chosen long beside the work of a scan."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from support.service_support import client_for, conversation, wait_for_outcome
from test_idle_compaction import completed_events, start_beat, submitted_at

from worker.backend import keys
from worker.backend.connection import connect
from worker.backend.redis_state import (
    IDLE_PER_TENANT,
    IDLE_SCAN_TENANTS,
    NO_TENANT,
    RedisState,
    idle_tenant,
)
from worker.config import Settings
from worker.wire.models import CONVERSATION_ID_PATTERN

BACKLOG = 100_000  # one tenant's idle conversations: the whole index of old
FILL_CHUNK = 10_000  # members per ZADD of the fill
LOST_AFTER_S = 600.0  # when the scan forgets a hand-out whose compaction never ended
WAIT_S = 90.0  # bounds a wait on a loaded machine; nothing is asserted about it
IDLE_S = 2.0
INTERVAL_S = 5.0  # the scan interval: long beside a scan's work (100 hand-outs ending at once)


@pytest.fixture(params=["standalone", "cluster"])
def state(request: pytest.FixtureRequest, sockets: None) -> Iterator[RedisState]:
    """The Redis adapter on a flushed standalone Redis, or on the session's Redis Cluster."""
    url = request.getfixturevalue("redis_url" if request.param == "standalone" else "cluster_url")
    made = RedisState(connect(url), Settings().redis)
    yield made
    made.client.close()


def fill(state: RedisState, tenant: str, count: int, *, oldest: float) -> list[str]:
    """``count`` conversations of ``tenant`` in the idle index, a millisecond apart from
    ``oldest`` on, written as a submitting program writes them (docs/redis-protocol.md): a few
    ZADDs of many members in one pipeline, then the tenant. Their ids, oldest first."""
    ids = [f"{tenant}:c-{k:06d}" for k in range(count)]
    pipe = state.client.pipeline(transaction=False)
    for start in range(0, count, FILL_CHUNK):
        chunk = ids[start : start + FILL_CHUNK]
        pipe.zadd(
            keys.idle_conversations(tenant),
            {c: oldest + (start + k) / 1000 for k, c in enumerate(chunk)},
        )
    pipe.zadd(keys.IDLE_TENANTS, {tenant: oldest}, lt=True)
    pipe.execute()
    return ids


def submit(state: RedisState, conversation_id: str, revision: int = 1) -> float:
    """A snapshot of the conversation stored as a client stores it; its submit time."""
    payload = json.dumps(conversation(conversation_id, 1, revision=revision)).encode()
    state.store_snapshot(conversation_id, revision, payload)
    return float(state.client.hget(keys.activity(conversation_id), "t"))


def test_a_tenant_with_a_full_index_holds_up_no_other(state: RedisState) -> None:
    """The quiet tenant's one conversation, newer than all 100,000 of the noisy one, is in the
    first scan, right after the noisy tenant's oldest; the noisy tenant gets its oldest 100, and
    no more while they are not finished."""
    noisy = fill(state, "noisy", BACKLOG, oldest=time.time() - 3600)
    quiet = "quiet:c-1"
    submit(state, quiet)
    first = state.take_idle(time.time(), busy_for_s=LOST_AFTER_S)
    assert first[:2] == [noisy[0], quiet]  # due longest first, then one turn each
    assert first[2:] == noisy[1:IDLE_PER_TENANT]
    assert state.client.zcard(keys.idle_conversations("noisy")) == BACKLOG - IDLE_PER_TENANT
    assert state.client.zcard(keys.idle_busy("noisy")) == IDLE_PER_TENANT

    # Nothing finished: the noisy tenant has no room; the quiet one's next comes at once.
    later = submit(state, "quiet:c-2")
    assert state.take_idle(later, busy_for_s=LOST_AFTER_S) == ["quiet:c-2"]
    for done in noisy[:3]:
        state.finish_idle(done)
    assert state.take_idle(time.time(), busy_for_s=LOST_AFTER_S) == noisy[100:103]


def test_tenants_beyond_a_scan_s_share_come_first_in_the_next(state: RedisState) -> None:
    """With room for two tenants per scan, three due tenants are served in turns: one that
    was looked at goes behind every tenant due longer than that scan."""
    now = time.time()
    backlog = {t: fill(state, t, 3, oldest=now - age) for t, age in [("a", 300), ("b", 200)]}
    backlog["c"] = fill(state, "c", 3, oldest=now - 100)
    taken = []
    for scan in range(4):
        found = state.take_idle(now - 10 + scan, busy_for_s=LOST_AFTER_S, per_tenant=1, tenants=2)
        for done in found:
            state.finish_idle(done)
        taken.append(found)
    a, b, c = backlog["a"], backlog["b"], backlog["c"]
    assert taken == [[a[0], b[0]], [c[0], a[1]], [b[1], c[1]], [a[2], b[2]]]


def test_a_conversation_is_taken_once_per_idle_period_and_only_once_due(
    state: RedisState,
) -> None:
    """A conversation is due ``idle_since`` after its newest snapshot; taken out when handed
    out, back with its next snapshot; an id without a tenant prefix has the tenant ``-``."""
    plain = "c-plain"
    assert idle_tenant(plain) == NO_TENANT and idle_tenant("acme:c-1") == "acme"
    at = submit(state, plain)
    assert state.take_idle(at - 1, busy_for_s=LOST_AFTER_S) == []  # not idle that long yet
    assert state.client.zscore(keys.idle_conversations(NO_TENANT), plain) == at
    assert state.take_idle(at, busy_for_s=LOST_AFTER_S) == [plain]
    assert state.take_idle(time.time(), busy_for_s=LOST_AFTER_S) == []  # taken out
    state.finish_idle(plain)
    again = submit(state, plain, revision=2)
    assert state.take_idle(again, busy_for_s=LOST_AFTER_S) == [plain]


def test_expired_entries_lost_hand_outs_and_emptied_tenants_leave_the_index(
    state: RedisState,
) -> None:
    """Entries older than the snapshots' lifetime are dropped (their snapshot is gone), a
    hand-out older than ``busy_for_s`` no longer counts, and a tenant with nothing indexed
    leaves the tenant list."""
    ttl = state.config.snapshot_ttl_s
    now = time.time()
    fill(state, "gone", 5, oldest=now - ttl - 100)
    fill(state, "full", IDLE_PER_TENANT + 1, oldest=now - 100)
    taken = state.take_idle(now, busy_for_s=LOST_AFTER_S)
    assert taken == [f"full:c-{k:06d}" for k in range(IDLE_PER_TENANT)]
    assert state.client.exists(keys.idle_conversations("gone")) == 0
    assert state.client.zscore(keys.IDLE_TENANTS, "gone") is None
    # Nothing finished: after busy_for_s the hand-outs are taken for lost, and room is back.
    assert state.take_idle(time.time(), busy_for_s=LOST_AFTER_S) == []
    assert state.take_idle(time.time(), busy_for_s=0) == [f"full:c-{IDLE_PER_TENANT:06d}"]
    assert state.take_idle(time.time(), busy_for_s=0) == []
    assert state.client.zscore(keys.IDLE_TENANTS, "full") is None  # nothing left to index


def test_the_idle_index_is_one_slot_no_conversation_can_share_a_key_of() -> None:
    """Every key of the idle index has the hash tag ``.idle``: the scan's script names a tenant
    list and many tenants' keys at once (the cluster runs of the tests above), and no
    conversation id is ``.idle``, so no conversation's key ever has that tag."""
    tenant_keys = [keys.IDLE_TENANTS, keys.idle_conversations("a"), keys.idle_busy("b:c")]
    assert all(k.startswith("cw:{.idle}:") for k in tenant_keys)
    assert re.fullmatch(CONVERSATION_ID_PATTERN, ".idle") is None


@contextmanager
def idle_commands(url: str) -> Iterator[list[str]]:
    """The commands run on the idle index while the block runs: the scan's own and those its
    script runs, not the script's call (the first one fails while the server has not loaded
    the script yet, and is sent again)."""
    calls: list[str] = []
    client = redis.Redis.from_url(url, socket_timeout=WAIT_S)
    marker = "end-of-the-watched-commands"
    try:
        with client.monitor() as monitor:
            yield calls
            client.echo(marker)
            while marker not in (seen := monitor.next_command())["command"]:
                if "{.idle}" in seen["command"] and not seen["command"].startswith("EVALSHA"):
                    calls.append(seen["command"].lower())
    finally:
        client.close()


def test_a_scan_does_the_same_work_whatever_the_index_holds(redis_url: str) -> None:
    """The same commands, each reading at most a tenant's share, with 1,000 or 100,000
    conversations of one tenant waiting."""
    state = RedisState(connect(redis_url), Settings().redis)
    try:
        seen: dict[int, list[str]] = {}
        for backlog in (1_000, BACKLOG):
            state.client.flushdb()
            fill(state, "noisy", backlog, oldest=time.time() - 3600)
            submit(state, "quiet:c-1")
            with idle_commands(redis_url) as calls:
                taken = state.take_idle(time.time(), busy_for_s=LOST_AFTER_S)
            assert len(taken) == IDLE_PER_TENANT + 1
            seen[backlog] = calls
    finally:
        state.client.close()
    assert list(map(shape, seen[1_000])) == list(map(shape, seen[BACKLOG]))
    limits: dict[str, int] = {}
    for read in (c for c in seen[BACKLOG] if c.startswith("zrange")):
        found = re.search(r"^zrange\S* (\S+) .* limit 0 (\d+)$", read)
        assert found is not None or read.endswith(" 0 0 withscores"), read  # the oldest one
        if found is not None:
            limits[found[1]] = int(found[2])
    assert limits == {
        keys.IDLE_TENANTS: IDLE_SCAN_TENANTS,
        keys.idle_conversations("noisy"): IDLE_PER_TENANT,
        keys.idle_conversations("quiet"): IDLE_PER_TENANT,
    }


def shape(command: str) -> str:
    """A command without its numbers (times, scores, the script's digest)."""
    return re.sub(r"[\d.]+", "N", command)


def test_another_tenant_is_compacted_within_two_scans_of_going_idle(
    service_env: Any, tmp_path: Path
) -> None:
    """Real workers and scheduler, 100,000 idle conversations of one tenant waiting (their
    snapshots long gone: each hand-out ends at once, as ``expired``). Another tenant's
    conversation is compacted within two scan intervals after it becomes due, while nearly
    all of that backlog still waits; the noisy tenant never has more than its share out, and
    gets more as its hand-outs end."""
    _, make = service_env
    workers = make(f"idle_compact_after_s = {IDLE_S}\nidle_threshold_tokens = 2000\n")
    client = client_for(workers)
    fill(client.state, "noisy", BACKLOG, oldest=time.time() - 3600)
    workers.start("w")
    start_beat(workers, tmp_path, interval_s=INTERVAL_S)
    backlog = keys.idle_conversations("noisy")
    wait_until(lambda: client.state.client.zcard(backlog) < BACKLOG, "the first scan")

    quiet = "quiet:c-1"
    snap = conversation(quiet, 11, window=1_000_000)
    client.submit(snap)
    assert wait_for_outcome(client, quiet)[-1].type == "compaction.skipped"
    due = submitted_at(client, quiet) + IDLE_S
    busy: list[int] = []

    def compacted() -> bool:
        busy.append(client.state.client.zcard(keys.idle_busy("noisy")))
        return bool(completed_events(client, quiet))

    wait_until(compacted, f"the idle compaction of {quiet}")
    event = completed_events(client, quiet)[0]
    assert event.trigger.kind == "idle" and event.revision == snap["revision"]
    made = event.created_at.timestamp()
    assert due <= made <= due + 2 * INTERVAL_S, f"compacted {made - due:.2f}s after due"
    assert client.state.client.zcard(backlog) > BACKLOG - 20 * IDLE_PER_TENANT
    assert max(busy) <= IDLE_PER_TENANT
    # Its hand-outs end (each frees its place), so the noisy tenant gets more in later scans.
    more = BACKLOG - 2 * IDLE_PER_TENANT
    wait_until(lambda: client.state.client.zcard(backlog) <= more, "a later noisy hand-out")


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S}s: {what}")
        time.sleep(0.1)
