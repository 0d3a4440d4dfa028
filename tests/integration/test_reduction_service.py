"""``[compaction] reduction`` through real Celery worker processes on a real Redis (one worker for
the module, configured with ``truncation``): conversations submitted by the client come back
as completed events with the strategy's replacement, a snapshot may pick another strategy, a
session applies them (its history is the strategy's), and a session of 200 turns stays bounded
with every tool call answered to the end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.pairs_support import openai_pairs_intact
from support.service_support import StartedWorkers, conversation, started_workers, wait_for_outcome

from worker.config import Settings
from worker.core.projection import count_request_tokens
from worker.core.reduction import marker_counts, masked_output
from worker.core.strategies import (
    CompactionStrategy,
    SelectiveToolResult,
    SelectiveToolResultConfig,
    SlidingWindow,
    SlidingWindowConfig,
    Truncation,
    TruncationConfig,
)
from worker.session import CompactingSession
from worker.tokens import tokenizer_for
from worker.wire import formats
from worker.wire.events import CompletedEvent
from worker.wire.history import apply_compaction
from worker.wire.models import Message
from worker.wire.snapshots import parse_snapshot

pytestmark = pytest.mark.slow

MAX_MESSAGES = 30
WINDOW = 16
KEEP = 2
CONFIG = f"""reduction = "truncation"
reduction_max_messages = {MAX_MESSAGES}
reduction_window = {WINDOW}
reduction_keep_tool_results = {KEEP}
max_persisted_transcripts = 200
"""
SETTLE_S = 60.0  # generous: the machine is shared


@pytest.fixture(scope="module")
def cluster(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartedWorkers]:
    """One worker process for the module, its configuration's reduction ``truncation``;
    conversation ids are distinct per test."""
    with started_workers(
        redis_server, tmp_path_factory.mktemp("reduction"), CONFIG, concurrency=4
    ) as started:
        yield started


def seed(reduction: str) -> CompactionStrategy:
    if reduction == "truncation":
        return Truncation(TruncationConfig(max_messages=MAX_MESSAGES))
    if reduction == "sliding_window":
        return SlidingWindow(SlidingWindowConfig(window=WINDOW))
    return SelectiveToolResult(SelectiveToolResultConfig(keep_last=KEEP))


def expected_ids(
    snap: dict[str, Any], settings: Settings, reduction: str, start: int, end: int
) -> list[str]:
    """The ids the seed strategy keeps of ``start..end``, run here on the parsed snapshot."""
    messages: list[Message] = parse_snapshot(json.dumps(snap).encode(), settings).messages
    return [m.id for m in seed(reduction).compact(messages) if start <= m.source_index < end]


def completed(cluster: StartedWorkers, snap: dict[str, Any]) -> CompletedEvent:
    cluster.client.submit(snap)
    outcome = wait_for_outcome(cluster.client, snap["conversation_id"], timeout_s=SETTLE_S)[-1]
    assert isinstance(outcome, CompletedEvent), outcome
    return outcome


def is_marker(message: dict[str, Any]) -> bool:
    text = message.get("content")
    if not isinstance(text, str):
        return False
    return marker_counts(Message(id="m", role="user", content=text, source_index=0)) is not None


@pytest.mark.parametrize(
    ("conversation_id", "override"),
    [
        ("c-red-cfg-1", None),
        ("c-red-cfg-2", None),
        ("c-red-cfg-3", None),
        ("c-red-own-sliding", "sliding_window"),
        ("c-red-own-selective", "selective_tool_result"),
    ],
)
def test_a_worker_publishes_the_strategys_replacement(
    cluster: StartedWorkers, conversation_id: str, override: str | None
) -> None:
    snap = conversation(conversation_id, 30, body=150)
    if override is not None:
        snap["config"] = {"reduction": override}
    reduction = override or "truncation"
    event = completed(cluster, snap)
    c = event.compaction
    assert (c.reduction, c.summary.source) == (reduction, "strategy")
    settings = cluster.workers.settings()
    *kept, marker = c.replacement
    assert [m["id"] for m in kept] == expected_ids(snap, settings, reduction, c.start, c.end)
    assert is_marker(marker) and marker["content"] == c.summary.text
    applied = apply_compaction(snap["messages"], event)
    openai_pairs_intact(applied)
    assert c.tokens_after < c.tokens_before
    assert c.transcript is not None  # stored as any compaction is
    assert cluster.client.restore(event) == snap["messages"]


def test_a_session_ends_up_with_the_strategys_history(cluster: StartedWorkers) -> None:
    """A session choosing masking for itself: the history it applied is the range with older
    outputs masked, then the marker, then the turns after it."""
    session = CompactingSession(
        "c-red-session",
        client=cluster.client,
        model="gpt-4.1",
        context_window=8000,
        config={"reduction": "masking"},
    )
    try:
        turns = conversation("c-red-session", 30, body=150)["messages"]
        session.extend(turns)
        assert session.wait_settled(SETTLE_S), session.status
        session.request_messages()  # applies what arrived
        (event,) = session.compactions
        c = event.compaction
        assert c.reduction == "masking"
        assert session.messages == apply_compaction(turns, event)
        outputs = [m for m in session.messages if m["role"] == "tool"]
        masked = [m for m in outputs if m["content"].startswith("[tool output masked:")]
        assert len(masked) == len(outputs) - KEEP  # the tail has no output of its own
        by_id = {m["id"]: m for m in turns}
        assert all(m["content"] == masked_output(by_id[m["id"]]["content"]) for m in masked)
        assert sum(is_marker(m) for m in session.messages) == 1
        openai_pairs_intact(session.messages)
    finally:
        session.close()


def test_200_turns_with_a_strategy_stay_bounded_with_every_call_answered(
    cluster: StartedWorkers,
) -> None:
    """The worker's own truncation over 200 turns: after the first compaction every request
    stays under the threshold plus one turn, tool calls keep their results, and one marker
    counts everything omitted so far."""
    window = 6000
    threshold = window * 75 // 100
    tokenizer = tokenizer_for("gpt-4.1")
    session = CompactingSession(
        "c-red-long", client=cluster.client, model="gpt-4.1", context_window=window
    )
    turns = conversation("c-red-long", 200, body=40)["messages"][:-1]
    sizes: list[int] = []
    try:
        session.extend(turns[:2])
        for k in range(2, len(turns), 2):
            session.extend(turns[k : k + 2])
            assert session.wait_settled(SETTLE_S), session.status
            request = session.request_messages()
            openai_pairs_intact(request)
            if session.compactions:
                sizes.append(
                    count_request_tokens(formats.to_messages("openai", request), tokenizer)
                )
        turn = count_request_tokens(formats.to_messages("openai", turns[2:4]), tokenizer)
        assert len(session.compactions) >= 5, session.status
        assert max(sizes) <= threshold + turn, (max(sizes), threshold)
        status = session.status
        assert status.compactions_failed == status.snapshots_rejected == 0, status
        assert {e.compaction.reduction for e in session.compactions} == {"truncation"}
        markers = [m for m in session.messages if is_marker(m)]
        assert len(markers) == 1  # each compaction took the earlier marker over
        counts = marker_counts(
            Message(id="m", role="user", content=markers[0]["content"], source_index=0)
        )
        assert counts is not None
        assert counts[0] + len(session.messages) - 1 == len(turns)  # every message accounted for
    finally:
        session.close()
