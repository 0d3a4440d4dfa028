"""The Redis adapter against a real Redis: what an evaluation leaves behind, and for how long.
Every test runs on a standalone Redis and on a 3-master Redis Cluster (which refuses any
command or script whose keys are in two slots)."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.service_support import conversation

from worker.backend import keys
from worker.backend.connection import connect
from worker.backend.redis_state import RedisState
from worker.config import Settings
from worker.pipeline import Adapters, Pipeline
from worker.runtime.service import Service
from worker.transcripts.filesystem import FileStore


@pytest.fixture(params=["standalone", "cluster"])
def state_url(request: pytest.FixtureRequest, sockets: None) -> str:
    """A flushed standalone Redis, or the session's Redis Cluster flushed."""
    return str(
        request.getfixturevalue("redis_url" if request.param == "standalone" else "cluster_url")
    )


@pytest.fixture
def open_client(state_url: str) -> Iterator[Callable[[], Any]]:
    """Clients of ``state_url`` (standalone or cluster), all closed after the test."""
    made: list[Any] = []

    def open_one() -> Any:
        made.append(connect(state_url))
        return made[-1]

    yield open_one
    for client in made:
        client.close()


def service(client: Any, tmp_path: Path, **config: Any) -> Service:
    settings = Settings(compaction={"transcript_dir": str(tmp_path), **config})
    return Service(
        settings=settings,
        state=RedisState(client, settings.redis),
        pipeline=Pipeline(settings, Adapters(store=FileStore(tmp_path))),
        enqueue_summarize=lambda *_: None,
        enqueue_evaluate=lambda *_: None,
    )


def test_an_evaluation_remembers_its_event_ids_only_as_long_as_a_redelivery_can_come(
    open_client: Any, tmp_path: Path
) -> None:
    svc = service(open_client(), tmp_path, keep_recent_tool_results=1)
    snap = conversation("c-ttl", 4, window=1_000_000)
    svc.state.store_snapshot("c-ttl", 0, json.dumps(snap).encode())
    assert svc.evaluate("c-ttl") == "skipped"
    events = [e for _, e in svc.state.read_events("c-ttl")]
    assert [e["type"] for e in events] == ["tool_results.elided", "compaction.skipped"]
    client = open_client()
    limit = svc._evaluation_dedup_ttl_s()
    assert limit < svc.settings.redis.stream_ttl_s
    for event in events:
        assert 0 < client.ttl(keys.published("c-ttl", event["event_id"])) <= limit
    # A second delivery of the same evaluation finds nothing to do and publishes nothing.
    assert svc.evaluate("c-ttl") == "superseded"
    assert len(svc.state.read_events("c-ttl")) == 2


def test_a_service_evaluates_a_grown_conversation_only_for_its_new_messages(
    open_client: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """Through the whole evaluate step (Redis, parse, memo, projection): the second snapshot
    of a conversation counts only what differs from the first in the process that saw it (a
    new exchange, and the closing message that moved: its id, ``end21``, is new)."""
    from worker.tokens import TiktokenTokenizer

    svc = service(open_client(), tmp_path)
    svc.state.store_snapshot(
        "c-grow", 1, json.dumps(conversation("c-grow", 20, window=1_000_000)).encode()
    )
    assert svc.evaluate("c-grow") == "skipped"
    # Watched at the tokenizer, which every message's count goes through (the projection's
    # own functions may be compiled, and call each other directly).
    texts: list[str] = []
    real = TiktokenTokenizer.count
    monkeypatch.setattr(
        TiktokenTokenizer, "count", lambda self, text: texts.append(text) or real(self, text)
    )
    grown = conversation("c-grow", 21, revision=2, window=1_000_000)
    svc.state.store_snapshot("c-grow", 2, json.dumps(grown).encode())
    assert svc.evaluate("c-grow") == "skipped"
    counted = [k for k, m in enumerate(grown["messages"]) if m.get("content") in texts]
    assert counted == [42, 43, 44]


def test_the_elided_event_of_a_revision_waiting_for_its_compaction_is_remembered_long(
    open_client: Any, tmp_path: Path
) -> None:
    """Over the threshold the revision stays pending until its compaction is published, and
    the reconciler may evaluate it again meanwhile: its elided event id must not expire."""
    svc = service(open_client(), tmp_path, keep_recent_tool_results=1)
    snap = conversation("c-over", 6, window=2000)
    svc.state.store_snapshot("c-over", 0, json.dumps(snap).encode())
    assert svc.evaluate("c-over") == "queued"
    events = [e for _, e in svc.state.read_events("c-over")]
    assert [e["type"] for e in events] == ["tool_results.elided"]
    ttl = open_client().ttl(keys.published("c-over", events[0]["event_id"]))
    assert ttl > svc._evaluation_dedup_ttl_s()


@pytest.mark.parametrize("first", [1, 10**14, 2**53 - 10])  # Lua writes 10**14 as 1e+14
def test_only_the_newest_payload_of_a_conversation_is_kept(
    open_client: Any, tmp_path: Path, first: int
) -> None:
    """Older payloads are never read again: one key holds the newest revision's, and a late
    older revision changes nothing."""
    svc = service(open_client(), tmp_path)
    client = open_client()
    stale = list(client.scan_iter(match="cw:{c-keep}:*"))  # from an earlier parameter
    if stale:
        client.delete(*stale)
    for revision in (first, first + 1, first + 2):
        snap = conversation("c-keep", 3 + revision - first, revision=revision, window=1_000_000)
        svc.state.store_snapshot("c-keep", revision, json.dumps(snap).encode())
    assert client.get(keys.latest("c-keep")) == str(first + 2).encode()
    stored = json.loads(zlib.decompress(client.get(keys.snapshot("c-keep"))))
    assert stored["revision"] == first + 2
    # An older revision arriving late is superseded and changes nothing.
    late = conversation("c-keep", 4, revision=first + 1, window=1_000_000)
    status = svc.state.store_snapshot("c-keep", first + 1, json.dumps(late).encode()).status
    assert status == "superseded"
    stored = json.loads(zlib.decompress(client.get(keys.snapshot("c-keep"))))
    assert stored["revision"] == first + 2
    assert svc.evaluate("c-keep") == "skipped"
    assert [e["revision"] for _, e in svc.state.read_events("c-keep")] == [first + 2]


def test_reconcile_leaves_live_leases_alone_and_requeues_each_conversation_once_per_delay(
    open_client: Any, tmp_path: Path
) -> None:
    """Issue 11: the reconciler re-queues a pending conversation whose lock lease is not alive
    (its holder died) and moves its score, so the next run does not re-queue it again; one
    whose lease is alive (a compaction in progress) is skipped and looked at again when that
    lease would lapse."""
    queued: list[str] = []
    svc = service(open_client(), tmp_path)
    svc.enqueue_evaluate = queued.append
    after_s = svc.settings.worker.reconcile_after_s
    client = open_client()
    for conv in ("c-dead", "c-busy"):
        svc.state.store_snapshot(conv, 1, json.dumps(conversation(conv, 2)).encode())
    long_ago = time.time() - 10 * after_s
    client.zadd("cw:pending", {"c-dead": long_ago, "c-busy": long_ago})
    token = svc.state.acquire_lock("c-busy", 20.0).token
    assert token is not None

    assert svc.reconcile() == ["c-dead"]
    assert queued == ["c-dead"]
    now = time.time()
    assert abs(client.zscore("cw:pending", "c-dead") - now) < 5  # waits after_s again
    busy = client.zscore("cw:pending", "c-busy")
    assert abs(busy - (now - after_s + 20.0)) < 5  # stale again when its lease would lapse
    assert svc.reconcile() == [] and queued == ["c-dead"]  # nothing twice

    svc.state.release_lock("c-busy", token)  # as if its lease had lapsed: re-queued next time
    client.zadd("cw:pending", {"c-busy": long_ago})
    assert svc.reconcile() == ["c-busy"]
    assert queued == ["c-dead", "c-busy"]


@pytest.mark.parametrize("revision", [None, 3, 4, 5])
def test_the_lock_is_refused_for_a_handled_revision_whoever_holds_it(
    open_client: Any, tmp_path: Path, revision: int | None
) -> None:
    """One step takes the lock, or refuses it: for a revision that has an outcome already
    (then nothing is written), or while another worker holds it."""
    state = service(open_client(), tmp_path).state
    client = open_client()
    client.set(keys.handled("c-claim"), 4)

    def take() -> Any:
        return state.acquire_lock("c-claim", 20.0, unless_handled=revision)

    first = take()
    if revision is not None and revision <= 4:
        assert (first.status, first.token) == ("handled", None)
        assert not client.exists(keys.lock("c-claim"), keys.fence("c-claim"))
        return
    assert first.status == "taken" and first.token is not None
    assert client.get(keys.lock("c-claim")).decode() == first.token
    again = take()
    assert (again.status, again.token) == ("held", None)
    client.set(keys.handled("c-claim"), 5)  # handled meanwhile: refused as such, even held
    assert take().status == ("held" if revision is None else "handled")
    state.release_lock("c-claim", first.token)
    assert take().status == ("taken" if revision is None else "handled")


def test_an_evaluation_that_meets_a_compaction_ending_is_never_left_to_the_lease(
    open_client: Any, tmp_path: Path
) -> None:
    """An evaluation over the threshold while another worker compacts defers its compaction to
    the holder: the holder's release queues an evaluation. The two race on every round here
    (the evaluation starts as the holder leaves), and whichever wins, a deferred one is always
    answered by that release; otherwise it waited for the lease to lapse (30 s by default)."""
    import threading

    svc = service(open_client(), tmp_path)
    client = open_client()
    for k in range(200):
        conv = f"c-race-{k}"
        rerun: list[str] = []
        svc.enqueue_evaluate = rerun.append
        outcome: list[str] = []
        start = threading.Barrier(2)

        def hold(conv: str = conv, start: threading.Barrier = start) -> None:
            with svc.holding(conv) as held:
                assert held.token is not None
                start.wait()  # the evaluation starts while the lock is still held

        holder = threading.Thread(target=hold)
        holder.start()
        start.wait()
        outcome.append(svc._hand_to_summarize(conv, 1))
        holder.join()
        assert (outcome, rerun) in ((["deferred"], [conv]), (["queued"], [])), (k, outcome, rerun)
        assert not client.exists(keys.rerun(conv)), k  # no flag left without a holder

    # A worker whose lease lapsed leaves the flag to the one that holds the lock now.
    lapsed = svc.state.acquire_lock("c-lapsed", 20.0).token
    client.delete(keys.lock("c-lapsed"))
    holder = svc.state.acquire_lock("c-lapsed", 20.0).token
    assert lapsed is not None and holder is not None
    assert svc.state.defer_to_holder("c-lapsed") > 0
    assert not svc.state.release_lock("c-lapsed", lapsed).rerun
    assert client.exists(keys.rerun("c-lapsed")) and client.exists(keys.lock("c-lapsed"))
    assert svc.state.release_lock("c-lapsed", holder).rerun
    assert svc.state.defer_to_holder("c-lapsed") == 0 and not client.exists(keys.rerun("c-lapsed"))


def test_a_compaction_on_demand_that_found_the_lock_held_is_queued_by_the_release(
    open_client: Any, tmp_path: Path
) -> None:
    """A compaction asked for while another compaction holds the conversation (a threshold
    one, or another compaction on demand) runs as that one releases the lock, not when its
    lease would lapse; a compaction on demand's release does not queue the request it took
    itself (one it failed on would queue itself again and again)."""
    from worker.wire.requests import CompactRequest

    svc = service(open_client(), tmp_path)
    compacts: list[tuple[str, float]] = []
    svc.enqueue_compact = lambda conv, delay_s: compacts.append((conv, delay_s))
    svc.state.store_snapshot("c-asked", 1, json.dumps(conversation("c-asked", 2)).encode())
    with svc.holding("c-asked") as held:
        assert held.token is not None
        svc.state.store_request("c-asked", CompactRequest(request_id="a" * 32))
        assert svc.compact_requested("c-asked") == "deferred"
        ((_, lease_wait_s),) = compacts
        assert lease_wait_s > 1  # its own task comes back when the lease would lapse
    assert compacts[1:] == [("c-asked", 0.0)]  # and the release queues it at once
    # A compaction on demand that took request a (and did not finish it) does not queue it.
    with svc.holding("c-asked") as held:
        assert held.token is not None
        held.taken_request = "a" * 32
    assert len(compacts) == 2
    # ... but request b, asked for while it ran, is queued by its release at once.
    with svc.holding("c-asked") as held:
        held.taken_request = "a" * 32
        svc.state.store_request("c-asked", CompactRequest(request_id="b" * 32))
        assert svc.compact_requested("c-asked") == "deferred"
    assert compacts[2][1] > 1 and compacts[3:] == [("c-asked", 0.0)]
    with svc.holding("c-asked") as held:  # nothing waits: nothing queued
        svc.state.done_request("c-asked", "b" * 32)
    assert len(compacts) == 4


def test_a_follower_whose_cancellation_was_swallowed_stops_at_the_next_slice() -> None:
    """A cancellation that lands inside redis-py's read can be swallowed there (its
    asyncio.timeout, Python 3.11, under load): the task stays cancelling but reads on. The
    blocking loop honours it between slices, so a cancelled follower always ends."""
    import asyncio
    import contextlib

    from worker.backend.streams import await_entries

    reads = 0

    async def swallowing_read(block: int) -> None:
        nonlocal reads
        reads += 1
        # what the swallowing read does: the task is still "cancelling" afterwards
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(block / 1000)

    async def scenario() -> None:
        task = asyncio.create_task(await_entries(swallowing_read, 0))  # 0: without end
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=60)

    asyncio.run(scenario())
    assert reads == 1
