"""Events are read tolerantly and applied only to the history they describe.

Each test here failed before events carried a schema version and a range digest and were read
tolerantly: a printed line of ``compactor events`` (which adds ``stream_id``) did not apply, an
unknown field broke every reader for good, and a conversation's event applied to another
conversation whose message ids happened to match.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from worker.config import Settings
from worker.errors import EventMismatch
from worker.pipeline import Adapters, Pipeline
from worker.transcripts.filesystem import FileStore
from worker.wire.events import (
    SCHEMA_VERSION,
    CompletedEvent,
    OtherEvent,
    SkippedEvent,
    parse_event,
)
from worker.wire.history import apply_compaction

SETTINGS = Settings(compaction={"summary_max_output_tokens": 200})


def numbered_conversation(conversation_id: str, topic: str, turns: int = 30) -> dict[str, Any]:
    """A conversation whose ids are m0000, m0001, ... (as every corpus conversation's are)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    messages.append({"role": "user", "content": f"Work on {topic}."})
    for k in range(turns):
        call = f"call_{k}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"cmd": f"ls {k}"})},
                    }
                ],
            }
        )
        body = " ".join(f"{topic}_{k}_{i}" for i in range(150))
        messages.append({"role": "tool", "tool_call_id": call, "content": body})
    messages.append({"role": "assistant", "content": "Done for now."})
    for i, m in enumerate(messages):
        m["id"] = f"m{i:04d}"
    return {
        "conversation_id": conversation_id,
        "revision": 1,
        "model": {"name": "gpt-4.1", "context_window": 8000},
        "messages": messages,
    }


def compacted(snapshot: dict[str, Any], root: Path) -> CompletedEvent:
    pipeline = Pipeline(SETTINGS, Adapters(store=FileStore(root)))
    event = pipeline.run(pipeline.parse(snapshot))[-1]
    assert isinstance(event, CompletedEvent), event
    return event


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], CompletedEvent, Any]:
    root = tmp_path_factory.mktemp("transcripts")
    alpha = numbered_conversation("c-alpha", "alpha")
    beta = numbered_conversation("c-beta", "beta")
    return alpha, compacted(alpha, root), beta


def test_an_event_applies_only_to_the_conversation_it_describes(two: Any) -> None:
    alpha, event, beta = two
    assert [m["id"] for m in alpha["messages"]] == [m["id"] for m in beta["messages"]]
    applied = apply_compaction(alpha["messages"], event)
    assert len(applied) < len(alpha["messages"])
    with pytest.raises(EventMismatch, match="differs"):
        apply_compaction(beta["messages"], event)
    with pytest.raises(EventMismatch, match="c-alpha"):
        apply_compaction(alpha["messages"], event, conversation_id="c-beta")
    assert apply_compaction(alpha["messages"], event, conversation_id="c-alpha") == applied


def test_an_edited_message_inside_the_range_refuses_the_event(two: Any) -> None:
    alpha, event, _ = two
    edited = copy.deepcopy(alpha["messages"])
    edited[event.compaction.start + 1]["content"] = "something else"
    with pytest.raises(EventMismatch):
        apply_compaction(edited, event)


def test_an_event_without_a_range_digest_is_refused(two: Any) -> None:
    alpha, event, _ = two
    older = event.model_copy(
        update={"compaction": event.compaction.model_copy(update={"range_sha256": None})}
    )
    with pytest.raises(EventMismatch, match="older version"):
        apply_compaction(alpha["messages"], older)


def test_a_printed_events_line_applies_as_it_is(two: Any) -> None:
    """``compactor events`` prints each event with its ``stream_id`` added."""
    alpha, event, _ = two
    line = json.loads(event.to_json()) | {"stream_id": "1700000000000-0"}
    assert apply_compaction(alpha["messages"], line) == apply_compaction(alpha["messages"], event)
    assert apply_compaction(alpha["messages"], json.dumps(line)) == apply_compaction(
        alpha["messages"], event
    )


def test_unknown_fields_are_ignored_at_every_level(two: Any) -> None:
    alpha, event, _ = two
    doc = json.loads(event.to_json())
    doc["added_in_a_later_version"] = {"x": 1}
    doc["compaction"]["new_field"] = [1, 2]
    doc["compaction"]["summary"]["fidelity"] = {"checked": 3}
    doc["trigger"]["counted_from"] = "usage"
    parsed = parse_event(doc)
    assert isinstance(parsed, CompletedEvent)
    assert apply_compaction(alpha["messages"], doc) == apply_compaction(alpha["messages"], event)


def test_an_unknown_event_type_parses_and_keeps_its_fields() -> None:
    doc = {
        "type": "compaction.verified",
        "schema_version": SCHEMA_VERSION,
        "event_id": "e1",
        "conversation_id": "c-1",
        "revision": 3,
        "created_at": "2026-12-01T00:00:00Z",
        "score": 0.9,
    }
    event = parse_event(doc)
    assert isinstance(event, OtherEvent) and event.type == "compaction.verified"
    assert json.loads(event.to_json())["score"] == 0.9
    with pytest.raises(EventMismatch, match="nothing to apply"):
        apply_compaction([], event)


def test_every_event_carries_the_schema_version(two: Any) -> None:
    _, event, _ = two
    assert json.loads(event.to_json())["schema_version"] == SCHEMA_VERSION
    skipped = SkippedEvent(
        event_id="e", conversation_id="c", revision=1, created_at="2026-12-01T00:00:00Z", reason="r"
    )
    assert json.loads(skipped.to_json())["schema_version"] == SCHEMA_VERSION


def test_a_completed_event_must_have_its_compaction() -> None:
    with pytest.raises(ValueError, match="compaction"):
        parse_event(
            {
                "type": "compaction.completed",
                "event_id": "e",
                "conversation_id": "c",
                "revision": 1,
                "created_at": "2026-12-01T00:00:00Z",
                "trigger": {"kind": "thresholds", "projected_tokens": 1},
            }
        )
