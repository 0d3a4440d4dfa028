"""CompactingSession against a real Redis and real worker processes (shared by the module):
long runs stay under the window, the agent never waits, resume, and stale compactions."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support.service_support import StartedWorkers, started_workers

from worker.backend import keys
from worker.backend.embedded import EmbeddedRedis
from worker.client import Client, project
from worker.config import CompactionConfig, Settings, with_redis_url
from worker.core.projection import count_request_tokens
from worker.errors import EventMismatch, InvalidSnapshot
from worker.session import AsyncCompactingSession, CompactingSession
from worker.tokens import tokenizer_for
from worker.wire import formats
from worker.wire.models import canonical_json

pytestmark = pytest.mark.slow

SETTLE_S = 60.0  # generous: the machine is shared


@pytest.fixture(scope="module")
def cluster(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartedWorkers]:
    """One worker process (evaluate + summarize) for the whole module; conversation ids are
    distinct per test, so nothing needs flushing between them."""
    with started_workers(
        redis_server,
        tmp_path_factory.mktemp("session"),
        "max_persisted_transcripts = 200\n",
        concurrency=4,
    ) as started:
        yield started


# --- helpers ------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], bool], timeout_s: float = SETTLE_S, what: Callable[[], Any] = str
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what()}")
        time.sleep(0.01)


def settled(session: CompactingSession | AsyncCompactingSession) -> bool:
    """Every turn is submitted and the service's outcome for the newest one has arrived."""
    s = session.status
    return (
        s.pending_submits == 0
        and s.last_submitted_revision is not None
        and s.last_outcome_revision is not None
        and s.last_outcome_revision >= s.last_submitted_revision
    )


def request_tokens(request: list[dict[str, Any]]) -> int:
    return count_request_tokens(formats.to_messages("openai", request), tokenizer_for("gpt-4.1"))


def assert_every_call_answered(request: list[dict[str, Any]]) -> None:
    calls = [c["id"] for m in request for c in m.get("tool_calls") or []]
    results = [m["tool_call_id"] for m in request if m.get("role") == "tool"]
    assert sorted(calls) == sorted(results)


def synthetic_turns(count: int, *, body: int = 40, ids: bool = False) -> list[list[dict[str, Any]]]:
    """Like service_support.conversation: a task, then ``count`` tool exchanges (messages
    without ids unless ``ids``: the derived ids shift as compactions land)."""
    turns: list[list[dict[str, Any]]] = [
        [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the failing test in src/pkg/core.py."},
        ]
    ]
    for k in range(count - 1):
        cid = f"call{k}"
        words = " ".join(f"token{k}_{i}" for i in range(body))
        turn = [
            {
                "role": "assistant",
                "content": f"Step {k}.",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"command": f"cat src/pkg/mod_{k}.py"}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": cid, "content": words},
        ]
        if ids:
            turn[0]["id"], turn[1]["id"] = f"a{k}", f"r{k}"
        turns.append(turn)
    return turns


def corpus_turns(corpus_dir: Path, count: int) -> list[list[dict[str, Any]]]:
    """``count`` turns of real conversations, longest first: a turn is a user message, or an
    assistant message with the tool results answering it. Later conversations continue the
    first (without their system prompt), their ids prefixed to stay unique."""
    paths = sorted(corpus_dir.glob("*.json.gz"), key=lambda p: -p.stat().st_size)
    turns: list[list[dict[str, Any]]] = []
    for n, path in enumerate(paths):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            messages = json.load(f)["messages"]
        if n:
            messages = [_prefixed(m, f"c{n}-") for m in messages if m["role"] != "system"]
        k = 0
        while k < len(messages) and len(turns) < count:
            turn = [messages[k]]
            k += 1
            if turn[0]["role"] == "assistant" and turn[0].get("tool_calls"):
                wanted = {c["id"] for c in turn[0]["tool_calls"]}
                while k < len(messages) and messages[k]["role"] == "tool":
                    turn.append(messages[k])
                    k += 1
                if wanted != {m["tool_call_id"] for m in turn[1:]}:
                    continue  # an unanswered call at the end of a trajectory
            if turn[0]["role"] == "system" and k < len(messages):
                turn.append(messages[k])  # the system prompt goes with the task
                k += 1
            turns.append(turn)
        if len(turns) >= count:
            return turns
    return turns


def _prefixed(message: dict[str, Any], prefix: str) -> dict[str, Any]:
    out = dict(message, id=prefix + message["id"])
    if "tool_call_id" in out:
        out["tool_call_id"] = prefix + out["tool_call_id"]
    if out.get("tool_calls"):
        out["tool_calls"] = [dict(c, id=prefix + c["id"]) for c in out["tool_calls"]]
    return out


def drive(cluster: Any, conversation_id: str, turns: list[list[Any]], window: int) -> None:
    """Every turn through a session, waiting for the service's outcome of each snapshot
    before the next model call (as the model's own latency would)."""
    session = CompactingSession(
        conversation_id, client=cluster.client, model="gpt-4.1", context_window=window
    )
    original: list[dict[str, Any]] = []
    largest = 0
    config = cluster.client.settings.compaction
    try:
        for turn in turns:
            session.extend(turn)
            original.extend(turn)
            wait_until(lambda: settled(session), what=lambda: session.status)
            request = session.request_messages()
            assert_every_call_answered(request)
            # computed for the new messages only, it is the projection of the whole history
            assert request == project(session.messages, model="gpt-4.1", config=config)
            if session.compactions:
                tokens = request_tokens(request)
                largest = max(largest, tokens)
                assert tokens < window
        status = session.status
        assert len(session.compactions) >= 3, status
        assert status.compactions_skipped == status.snapshots_rejected == 0, status
        assert status.compactions_failed == 0, status
        assert largest > window // 2  # it did run close to the window

        # every message a compaction replaced can be recalled, by its id or a tool call id
        tool = session.recall_tool()
        assert tool.openai["function"]["name"] == tool.anthropic["name"] == "recall_message"
        for event in session.compactions:
            before = cluster.client.restore(event)
            c = event.compaction
            ids = formats.source_ids(before)
            for k in range(c.start, c.end):
                assert session.recall(ids[k]) == before[k]
                if before[k].get("role") == "tool":
                    assert session.recall(before[k]["tool_call_id"]) == before[k]
            answer = tool.handler(json.dumps({"id": ids[c.end - 1]}))
            assert json.loads(answer) == before[c.end - 1]
            assert json.loads(tool.handler({"id": ids[c.start]})) == before[c.start]
        assert tool.handler({"id": "no-such-id"}).startswith("error: no compacted message")
        assert_provenance_recalls(session, cluster.client)

        # undoing every compaction gives back exactly what was appended
        while session.compactions:
            session.undo()
        assert canonical_json(session.messages) == canonical_json(original)
        assert session.messages == original
    finally:
        session.close()


def assert_provenance_recalls(session: CompactingSession, client: Client) -> int:
    """Every id a compaction's provenance lists (each summary section's sources, each dropped
    entry's message and call) recalls, through the session, the message of its transcript.
    A message a compaction carried keeps its id in the replacement, so a later compaction's
    transcript holds that copy too, and recall (newest compaction first) returns the copy.
    Returns how many ids were checked."""
    checked = 0
    for n, event in enumerate(session.compactions):
        before = client.restore(event)
        c = event.compaction
        where = {mid: k for k, mid in enumerate(formats.source_ids(before)) if c.start <= k < c.end}
        listed = [i for section in c.summary.sections for i in section.source_ids]
        listed += [d.message_id for d in c.dropped]
        assert listed, event.event_id
        carried_on = {i for e in session.compactions[n:] for i in e.compaction.preserved_ids}
        for message_id in listed:
            recalled = session.recall(message_id)
            assert recalled == before[where[message_id]] or message_id in carried_on
            checked += 1
        for d in c.dropped:
            if d.call_id is not None:  # the call's result (the call itself when it has none)
                assert d.call_id in json.dumps(session.recall(d.call_id))
    return checked


# --- the long runs ------------------------------------------------------------------------


def test_200_corpus_turns_stay_under_the_window_and_undo_to_the_original(
    cluster: Any, corpus_dir: Path
) -> None:
    turns = corpus_turns(corpus_dir, 200)
    assert len(turns) == 200
    drive(cluster, "c-session-corpus", turns, window=24_000)


def test_200_synthetic_turns_stay_under_the_window_and_undo_to_the_original(
    cluster: Any,
) -> None:
    drive(cluster, "c-session-synthetic", synthetic_turns(200), window=6_000)


def test_200_turns_stay_under_the_threshold_plus_a_turn_across_a_worker_restart(
    cluster: Any,
) -> None:
    """The session applies each event itself: after the first compaction, every request stays
    under the threshold plus one turn to the last of 200 turns, with the worker process
    replaced midway (what matters is in Redis, not in a process)."""
    window = 4_000
    threshold = CompactionConfig().auto_compact_threshold(window)
    assert threshold is not None
    session = CompactingSession(
        "c-session-bounded", client=cluster.client, model="gpt-4.1", context_window=window
    )
    turns = synthetic_turns(200, body=120)
    turn_tokens = max(request_tokens(turn) for turn in turns[1:])
    sizes: list[int] = []
    try:
        for k, turn in enumerate(turns):
            if k == 100:
                cluster.workers.stop("w1")
                cluster.workers.start("w1", concurrency=4)
            session.extend(turn)
            wait_until(lambda: settled(session), what=lambda: session.status)
            request = session.request_messages()
            if session.compactions:
                sizes.append(request_tokens(request))
        assert len(session.compactions) >= 20, session.status
        assert max(sizes) <= threshold + turn_tokens, (threshold, turn_tokens, sizes)
        assert session.status.compactions_skipped == 0, session.status
    finally:
        session.close()


# --- never blocking -----------------------------------------------------------------------


def test_extend_and_request_return_while_redis_is_down(tmp_path: Path, sockets: None) -> None:
    """No workers: what matters is that the calls return, the status says what is pending and
    why, and the newest snapshot reaches Redis once it is back."""
    server = EmbeddedRedis(directory=tmp_path / "redis")
    url = server.start()
    settings = with_redis_url(
        Settings(compaction=CompactionConfig(transcript_dir=tmp_path / "transcripts")), url
    )
    client = Client(settings)
    session = CompactingSession("c-down", client=client, model="gpt-4.1", context_window=100_000)
    turns = synthetic_turns(40)
    try:
        session.extend(turns[0])
        session.request_messages()  # the tokenizer is loaded: what follows is the calls alone
        wait_until(lambda: session.status.last_submitted_revision == 0, 10)
        server.stop()
        # A Redis that accepts connections and never answers: a call that waited on it would
        # take the client's read timeout (10 s) at least; these take milliseconds
        # (BENCHMARKS.md), so a bound of half that timeout holds on any machine.
        hung = socket.create_server(("127.0.0.1", server.port), backlog=128)
        took = []
        for turn in turns[1:]:
            started = time.perf_counter()
            session.extend(turn)
            session.request_messages()
            took.append(time.perf_counter() - started)
        assert max(took) < 5.0, took
        hung.close()  # now down: the sender's attempts are refused at once
        wait_until(lambda: session.status.submit_failures > 0, 120)
        status = session.status
        assert status.pending_submits == len(turns) - 1
        assert status.retrying and status.last_error and "redis" in status.last_error
        assert status.last_submitted_revision == 0

        restarted = EmbeddedRedis(directory=tmp_path / "redis", port=server.port)
        restarted.start()
        try:
            wait_until(lambda: session.status.pending_submits == 0, 30)
            status = session.status
            assert not status.retrying and status.last_error is None
            revision = status.last_submitted_revision
            assert revision is not None and revision > 0
            r = redis.Redis.from_url(url)
            assert int(r.get(keys.latest("c-down"))) == revision
            stored = json.loads(zlib.decompress(r.get(keys.snapshot("c-down"))))
            assert stored["messages"] == session.messages == [m for t in turns for m in t]
            r.close()
        finally:
            session.close(timeout_s=0)
            restarted.stop()
    finally:
        session.close(timeout_s=0)
        client.close()
        server.stop()


# --- resume -------------------------------------------------------------------------------


def over_threshold(session: CompactingSession, turns: list[list[Any]]) -> int:
    """Extend until a compaction has arrived (not yet drained); how many turns it took."""
    for n, turn in enumerate(turns, start=1):
        session.extend(turn)
        wait_until(lambda: settled(session), what=lambda: session.status)
        if any(e.type == "compaction.completed" for e in _unread(session)):
            return n
    raise AssertionError("no compaction arrived")


def _unread(session: CompactingSession) -> list[Any]:
    return [event for _, event in list(session._inbox.queue)]


def test_resume_continues_revisions_and_applies_each_event_once(cluster: Any) -> None:
    client = cluster.client
    cid = "c-session-resume"
    turns = synthetic_turns(60)
    a = CompactingSession(cid, client=client, model="gpt-4.1", context_window=6_000)
    over_threshold(a, turns)
    undrained = json.loads(json.dumps(a.state()))  # saved before the compaction is applied
    a.request_messages()
    assert len(a.compactions) == 1
    drained = json.loads(json.dumps(a.state()))
    a.close()

    # resumed from before the drain: the compaction is read again and applied once
    b = CompactingSession.from_state(undrained, client=client)
    wait_until(lambda: any(e.type == "compaction.completed" for e in _unread(b)), 30)
    b.request_messages()
    b.request_messages()
    assert b.messages == a.messages
    assert [e.event_id for e in b.compactions] == [e.event_id for e in a.compactions]
    assert b.status.events_applied == 1
    b.close()

    # resumed from after it: nothing is applied again, and revisions go on from the state
    c = CompactingSession.from_state(drained, client=client)
    time.sleep(1.0)  # let the follower read whatever is after the saved event id
    c.request_messages()
    assert c.status.events_applied == 0 and c.messages == a.messages
    assert len(c.compactions) == 1
    c.extend(turns[-1])
    wait_until(lambda: settled(c))
    first = c.status.last_submitted_revision
    assert first is not None and first > drained["revision"]
    saved = c.state()
    c.close()

    # a state whose revision is behind the service's: the service's newest wins
    behind = saved | {"revision": 0}
    d = CompactingSession.from_state(behind, client=client)
    d.extend([{"role": "user", "content": "And now the docs, please."}])
    wait_until(lambda: settled(d))
    revision = d.status.last_submitted_revision
    assert revision is not None and revision > first
    assert d.status.snapshots_rejected == 0
    d.close()


def compacted_three_times(cluster: Any, cid: str) -> CompactingSession:
    """A session whose history has had three compactions applied (the later ones compacting
    the earlier summaries again)."""
    session = CompactingSession(cid, client=cluster.client, model="gpt-4.1", context_window=6_000)
    for turn in synthetic_turns(200):
        session.extend(turn)
        wait_until(lambda: settled(session), what=lambda: session.status)
        session.request_messages()
        if len(session.compactions) >= 3:
            return session
    raise AssertionError(f"three compactions did not arrive: {session.status}")


def version_1(state: dict[str, Any], events: list[Any]) -> dict[str, Any]:
    """``state`` as sessions wrote it before version 2: every applied event whole."""
    saved = [
        {"event": event.model_dump(mode="json"), "index": item["index"], "size": item["size"]}
        for event, item in zip(events, state["compactions"], strict=True)
    ]
    return state | {"version": 1, "compactions": saved}


def test_a_state_holds_each_replacement_once_and_resumes_with_recall(cluster: Any) -> None:
    a = compacted_three_times(cluster, "c-session-state-size")
    try:
        state = json.loads(json.dumps(a.state()))
        events = a.compactions
        assert state["version"] == 2
        kept = [item["replacement"] for item in state["compactions"]]
        assert kept[-1] == "in_history" and "in_later_transcript" in kept, kept
        text = json.dumps(state)
        newest = events[-1].compaction.summary.text
        assert text.count(json.dumps(newest)[1:-1]) == 1  # in the history only
        for event, where in zip(events, kept, strict=True):
            if where == "in_later_transcript":  # not in the history: not in the state
                assert json.dumps(event.compaction.summary.text)[1:-1] not in text
        # Beside the history, the compactions cost what the replacements and the earlier
        # summaries' texts no longer add (docs/session.md measures a longer session).
        history = len(json.dumps(state["messages"]))
        added, added_before = (
            len(text) - history,
            len(json.dumps(version_1(state, events))) - history,
        )
        replaced = sum(
            len(json.dumps(e.compaction.replacement)) + len(json.dumps(e.compaction.summary.text))
            for e in events
        )
        assert added <= added_before - replaced + 1_000 * len(events), (added, added_before)

        b = CompactingSession.from_state(state, client=cluster.client)
        try:
            assert b.messages == a.messages
            assert [e.event_id for e in b.compactions] == [e.event_id for e in events]
            assert b.compactions[-1] == events[-1]  # the one in the history, whole
            for event in events:  # every replaced message recalls as in the saved session
                c = event.compaction
                before = formats.source_ids(cluster.client.restore(event))
                for message_id in before[c.start : c.end]:
                    assert b.recall(message_id) == a.recall(message_id)
            undone = b.undo()  # the newest, from the history's copy
            assert undone == a.undo()
            with pytest.raises(EventMismatch):  # the next one's replacement was not kept
                b.undo()
        finally:
            b.close()
    finally:
        a.close()


def test_a_version_1_state_still_resumes_whole(cluster: Any) -> None:
    a = compacted_three_times(cluster, "c-session-state-v1")
    try:
        state = json.loads(json.dumps(a.state()))
        old = json.loads(json.dumps(version_1(state, a.compactions)))
        b = CompactingSession.from_state(old, client=cluster.client)
        try:
            assert b.messages == a.messages and b.compactions == a.compactions
            while b.compactions:  # every compaction undone, as in the saved session
                b.undo()
            while a.compactions:
                a.undo()
            assert b.messages == a.messages
        finally:
            b.close()
        with pytest.raises(ValueError, match="version 1 or 2"):
            CompactingSession.from_state(old | {"version": 3}, client=cluster.client)
    finally:
        a.close()


# --- races: compactions of a history that changed meanwhile -------------------------------


def test_a_compaction_of_an_edited_history_is_skipped_counted_and_the_next_one_applies(
    cluster: Any,
) -> None:
    session = CompactingSession(
        "c-session-edit", client=cluster.client, model="gpt-4.1", context_window=6_000
    )
    try:
        over_threshold(session, synthetic_turns(60))
        edited = session.messages
        edited[3] = dict(edited[3], content=edited[3]["content"] + " (edited by the agent)")
        session.replace_messages(edited)
        session.request_messages()
        status = session.status
        assert status.compactions_skipped == 1 and status.events_applied == 0
        assert "differs" in (status.last_skip_reason or "")
        assert session.compactions == [] and session.messages == edited
        # the edited history was submitted: it is compacted instead
        wait_until(lambda: settled(session), what=lambda: session.status)
        session.request_messages()
        assert len(session.compactions) == 1
        assert session.recall(formats.source_ids(edited)[3]) == edited[3]
    finally:
        session.close()


def test_messages_appended_while_a_compaction_was_made_survive_it(cluster: Any) -> None:
    session = CompactingSession(
        "c-session-meanwhile", client=cluster.client, model="gpt-4.1", context_window=6_000
    )
    turns = synthetic_turns(80)
    try:
        used = over_threshold(session, turns)
        meanwhile = [m for t in turns[used : used + 3] for m in t]
        session.extend(meanwhile)  # after the snapshot the compaction was made from
        request = session.request_messages()
        assert len(session.compactions) >= 1 and session.status.compactions_skipped == 0
        assert session.messages[-len(meanwhile) :] == meanwhile
        assert_every_call_answered(request)
    finally:
        session.close()


def test_a_compaction_made_before_an_undo_is_skipped_and_counted(cluster: Any) -> None:
    session = CompactingSession(
        "c-session-undo", client=cluster.client, model="gpt-4.1", context_window=6_000
    )
    turns = synthetic_turns(120)
    try:
        used = over_threshold(session, turns[:60])
        session.request_messages()
        assert len(session.compactions) == 1
        used += over_threshold(session, turns[used:])
        session.undo()  # the arrived compaction describes the history with the undone one
        session.request_messages()
        status = session.status
        assert status.compactions_skipped == 1 and status.compactions_undone == 1
        assert session.compactions == []
        assert session.messages == [m for t in turns[:used] for m in t]
    finally:
        session.close()


def test_a_rejected_snapshot_is_reported_in_the_status(cluster: Any) -> None:
    session = CompactingSession("c-session-rejected", client=cluster.client, model="gpt-4.1")
    try:
        session.extend([{"role": "user", "content": "hi"}])
        session.extend([{"role": "tool", "tool_call_id": "nope", "content": "orphan"}])
        wait_until(lambda: settled(session), what=lambda: session.status)
        status = session.status
        assert status.snapshots_rejected == 1 and "nope" in (status.last_rejection or "")
        assert session.messages[-1]["content"] == "orphan"  # the history stays the agent's
        with pytest.raises(InvalidSnapshot, match="nope"):  # projecting it finds the same
            session.request_messages()
    finally:
        session.close()


# --- asyncio ------------------------------------------------------------------------------


def test_the_async_session_compacts_recalls_and_undoes(cluster: Any) -> None:
    async def run() -> None:
        session = AsyncCompactingSession(
            "c-session-async", client=cluster.client, model="gpt-4.1", context_window=6_000
        )
        original: list[dict[str, Any]] = []
        async with session:
            for turn in synthetic_turns(60, ids=True):
                await session.extend(turn)
                original.extend(turn)
                deadline = time.monotonic() + SETTLE_S
                while not settled(session):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
                request = await session.request_messages()
                assert_every_call_answered(request)
                if session.compactions:
                    assert request_tokens(request) < 6_000
            assert session.compactions
            assert await session.recall("r0") == original[3]
            answer = await session.recall_tool().handler('{"id": "call0"}')
            assert json.loads(answer) == original[3]
            while session.compactions:
                await session.undo()
            assert session.messages == original

    asyncio.run(run())


def test_every_provenance_id_recalls_its_message(cluster: Any) -> None:
    """Real compactions by the worker, with an omitted and a stripped tool among the calls: the
    sections' sources and the dropped entries all resolve through the session's recall path
    (the recall tool included)."""
    turns = synthetic_turns(60, ids=True)
    for k, turn in enumerate(turns[1:]):
        call = turn[0]["tool_calls"][0]["function"]
        call["name"] = ("bash", "grep", "heartbeat")[k % 3]
    tools = {"grep": {"compaction": "strip-responses"}, "heartbeat": {"compaction": "omit"}}
    session = CompactingSession(
        "c-session-provenance",
        client=cluster.client,
        model="gpt-4.1",
        context_window=6_000,
        tools=tools,
    )
    try:
        for turn in turns:
            session.extend(turn)
            wait_until(lambda: settled(session), what=lambda: session.status)
            session.request_messages()
        assert session.compactions, session.status
        kinds = {d.kind for e in session.compactions for d in e.compaction.dropped}
        assert {"tool_call_omitted", "tool_output_stripped"} <= kinds
        assert assert_provenance_recalls(session, cluster.client) > 0
        tool = session.recall_tool()
        event = session.compactions[0]
        first = event.compaction.summary.sections[0].source_ids[0]
        assert json.loads(tool.handler({"id": first})) == session.recall(first)
    finally:
        session.close()


# --- the incremental projection -----------------------------------------------------------


def anthropic_turns(count: int) -> list[list[dict[str, Any]]]:
    turns: list[list[dict[str, Any]]] = [[{"role": "user", "content": "Fix the failing test."}]]
    for k in range(count):
        call = {"type": "tool_use", "id": f"toolu_{k}", "name": "bash", "input": {"n": k}}
        body = "\n".join(["PASSED tests/test_core.py::test_parse"] * 60 + [f"done {k}"])
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": body}
        turns.append(
            [
                {"role": "assistant", "content": [{"type": "text", "text": f"Step {k}."}, call]},
                {"role": "user", "content": [result, {"type": "text", "text": "go on"}]},
            ]
        )
    return turns


def compressible_openai_turns(count: int) -> list[list[dict[str, Any]]]:
    turns = synthetic_turns(count)
    for k, turn in enumerate(turns[1:]):
        turn[1]["content"] = "\n".join(["ok tests/test_core.py::test_parse"] * 60 + [f"{k}"])
    return turns


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
@pytest.mark.parametrize("config", [None, {"keep_recent_tool_results": 3}], ids=["own", "recent"])
def test_the_request_is_the_projection_of_the_whole_history(
    redis_server: str,
    fmt: str,
    config: dict[str, Any] | None,
) -> None:
    """Whether computed for the new messages only (each result projects on its own) or
    whole (a rule couples the results), and across an edit, the request is ``project`` of the
    history."""
    client = Client(with_redis_url(Settings(), redis_server))
    system = "You are a coding agent." if fmt == "anthropic" else None
    session = CompactingSession(
        f"c-session-projection-{fmt}-{bool(config)}",
        client=client,
        format=fmt,  # type: ignore[arg-type]
        model="gpt-4.1",
        config=config,
        system=system,
    )
    settings = client.settings.with_overrides(config, None).compaction
    turns = anthropic_turns(30) if fmt == "anthropic" else compressible_openai_turns(30)
    changed = 0
    try:
        for k, turn in enumerate(turns):
            if k == 20:  # an edit: the next request is projected whole again
                session.replace_messages(session.messages[:-1])
            session.extend(turn)
            request = session.request_messages()
            whole = project(
                session.messages, format=fmt, model="gpt-4.1", config=settings, system=system
            )
            assert request == whole
            changed += request != session.messages
        assert changed > 20  # the projection did change the tool results
    finally:
        session.close(timeout_s=0)
        client.close()


def test_a_snapshot_the_client_refuses_is_dropped_with_the_error(redis_server: str) -> None:
    settings = with_redis_url(
        Settings(compaction=CompactionConfig(max_snapshot_bytes=1024)), redis_server
    )
    client = Client(settings)
    session = CompactingSession("c-session-refused", client=client)
    try:
        session.extend([{"role": "user", "content": "x" * 2000}])
        wait_until(lambda: session.status.last_error is not None, 10)
        status = session.status
        assert status.last_error is not None and status.last_error.startswith("invalid_snapshot")
        assert status.pending_submits == 0 and not status.retrying
        assert status.last_submitted_revision is None
    finally:
        session.close(timeout_s=0)
        client.close()
