"""Every compaction composed into one edit of the full history (worker.wire.composed): the same
history as applying each event in turn, for any number of compactions, with a record whose size
does not grow with the conversation."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.client import EventMismatch, apply_compaction
from worker.config import Settings
from worker.pipeline import Adapters, Pipeline
from worker.transcripts.filesystem import FileStore
from worker.wire.composed import ComposedCompaction, apply_composed, chain_digest, compose
from worker.wire.events import CompletedEvent

THRESHOLD = 2500


def turn(k: int, *, words: int = 60) -> list[dict[str, Any]]:
    """One agent turn as a proxy sees it (no message ids): a user request, a tool call and its
    output, the assistant's answer."""
    body = " ".join(f"line{k}_{i} src/pkg/mod_{k % 7}.py" for i in range(words))
    return [
        {"role": "user", "content": f"Step {k}: look at src/pkg/mod_{k % 7}.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{k}",
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": json.dumps({"command": f"cat src/pkg/mod_{k % 7}.py"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"call_{k}", "content": body},
        {"role": "assistant", "content": f"Read mod_{k % 7}; next step {k + 1}."},
    ]


def snapshot(messages: list[dict[str, Any]], revision: int) -> dict[str, Any]:
    return {
        "conversation_id": "c-composed",
        "revision": revision,
        "format": "openai",
        "model": {"name": "gpt-4.1"},
        "messages": messages,
        "config": {
            "auto_compact_threshold_tokens": THRESHOLD,
            "summary_max_output_tokens": 300,
            "preserve_recent_user_tokens": 200,
        },
    }


class Session:
    """The worker's side of a conversation, in process: each snapshot parsed with the
    compactions so far (the composed one, else the newest eight events, as Redis keeps them),
    evaluated, and compacted over the threshold."""

    def __init__(self, root: Path) -> None:
        self.pipeline = Pipeline(Settings(), Adapters(store=FileStore(root)))
        self.composed: ComposedCompaction | None = None
        self.last: list[CompletedEvent] = []
        self.events: list[CompletedEvent] = []

    def submit(self, messages: list[dict[str, Any]], revision: int) -> int:
        """The projected tokens of the request this snapshot stands for."""
        parsed = self.pipeline.parse(
            snapshot(messages, revision), published=self.last, composed=self.composed
        )
        verdict = self.pipeline.evaluate(parsed)
        if verdict.over_threshold:
            event = self.pipeline.compact(parsed, verdict.evaluation)
            assert isinstance(event, CompletedEvent), event
            self.composed = compose(self.composed, parsed.snapshot.messages, event)
            self.last = [*self.last, event][-8:]
            self.events.append(event)
        return verdict.evaluation.projected_tokens


def one_turn_tokens() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(Path(tmp))
        base = [{"role": "system", "content": "You are a coding agent."}]
        return session.submit([*base, *turn(10)], 1) - session.submit(base, 0)


@pytest.mark.parametrize("sender", ["full history", "applies events"])
def test_two_hundred_turns_stay_bounded_after_the_first_compaction(
    tmp_path: Path, sender: str
) -> None:
    """The proxy and HTTP clients send the full history every turn; the client and the session
    apply events themselves. Either way, every request after the first compaction stays under
    the threshold plus one turn, to the last of 200 turns and 40+ compactions."""
    session = Session(tmp_path)
    full: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    compacted = list(full)  # what an agent applying the events itself holds
    bound = THRESHOLD + one_turn_tokens()
    sizes = []
    for k in range(200):
        full += turn(k)
        compacted += turn(k)
        sent = full if sender == "full history" else compacted
        before = len(session.events)
        sizes.append(session.submit(copy.deepcopy(sent), k))
        for event in session.events[before:]:
            compacted = apply_compaction(compacted, event)
    first = next(i for i, s in enumerate(sizes) if s > THRESHOLD)
    assert len(session.events) >= 40
    assert max(sizes[first + 1 :]) <= bound, (bound, sizes)
    if sender == "full history":
        # What the proxy forwards: the full history with every compaction applied at once,
        # the very history an agent applying each event in turn holds.
        assert session.composed is not None
        assert apply_composed(full, session.composed) == compacted
        assert session.composed.compactions == len(session.events)
        assert len(session.composed.to_json()) < 4 * len(
            json.dumps(session.events[-1].compaction.replacement)
        )


def applied_in_turn(messages: list[dict[str, Any]], events: list[CompletedEvent]) -> list[Any]:
    for event in events:
        messages = apply_compaction(messages, event)
    return messages


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.integers(min_value=1, max_value=6), min_size=3, max_size=12),
    words=st.integers(min_value=20, max_value=120),
)
def test_composed_equals_every_event_applied_in_turn(turns: list[int], words: int) -> None:
    """Whatever the growth between snapshots, the composition applied to the full history is
    the history with each event applied in order."""
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(Path(tmp))
        full: list[dict[str, Any]] = [{"role": "system", "content": "Agent."}]
        k = 0
        for revision, grow in enumerate(turns):
            for _ in range(grow):
                full += turn(k, words=words)
                k += 1
            session.submit(copy.deepcopy(full), revision)
            if session.composed is not None:
                assert apply_composed(full, session.composed) == applied_in_turn(
                    full, session.events
                )


def test_an_edited_or_compacted_history_is_refused(tmp_path: Path) -> None:
    session = Session(tmp_path)
    full: list[dict[str, Any]] = [{"role": "system", "content": "Agent."}]
    for k in range(40):
        full += turn(k)
        session.submit(copy.deepcopy(full), k)
    composed = session.composed
    assert composed is not None and composed.compactions >= 2
    edited = copy.deepcopy(full)
    edited[composed.start + 1]["content"] = "edited"
    with pytest.raises(EventMismatch, match="differs"):
        apply_composed(edited, composed)
    with pytest.raises(EventMismatch):
        apply_composed(applied_in_turn(full, session.events), composed)
    with pytest.raises(EventMismatch, match="shorter"):
        apply_composed(full[: composed.start + composed.count - 1], composed)


def test_the_chained_digest_extends_in_steps() -> None:
    messages = [{"role": "user", "content": str(i)} for i in range(10)]
    assert chain_digest(chain_digest("", messages[:4]), messages[4:]) == chain_digest("", messages)
    assert chain_digest("", messages[::-1]) != chain_digest("", messages)
