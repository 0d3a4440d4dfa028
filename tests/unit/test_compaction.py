"""Range selection, per-tool hints, the event and apply_compaction, over generated histories."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.histories import histories, snapshot

from worker.client import EventMismatch, apply_compaction
from worker.config import Settings
from worker.core.groups import group_messages
from worker.core.planning import STRIPPED_ARGUMENTS, STRIPPED_RESPONSE
from worker.pipeline import Adapters, Pipeline, tokens_of
from worker.summarize import SUMMARY_MARKER
from worker.tokens import Tokenizer
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompactionEvent
from worker.wire.history import apply_built
from worker.wire.snapshots import parse_snapshot


def _compact(snap: dict[str, Any], root: Path) -> CompactionEvent:
    snap["config"].setdefault("summary_max_output_tokens", 300)
    parsed = parse_snapshot(snap, Settings())
    return Pipeline(parsed.settings, Adapters(store=FileStore(root))).run(parsed)[-1]


def _pairs_intact(messages: list[dict[str, Any]], start: int, end: int) -> bool:
    """No tool call inside [start, end) has a result outside it, and vice versa."""
    call_at = {c["id"]: i for i, m in enumerate(messages) for c in m.get("tool_calls") or []}
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            j = call_at[m["tool_call_id"]]
            if (start <= i < end) != (start <= j < end):
                return False
    return True


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=histories(), threshold=st.integers(0, 3000))
def test_compaction_properties(messages: list[dict[str, Any]], threshold: int) -> None:
    snap = snapshot(messages, threshold=threshold)
    with tempfile.TemporaryDirectory() as root:
        event = _compact(snap, Path(root))
        assert event.type in ("compaction.completed", "compaction.skipped")
        if event.type == "compaction.skipped":
            return
        c = event.compaction
        assert c is not None and c.transcript is not None
        assert 0 <= c.start < c.end <= len(messages)
        # leading system messages stay; the newest message is never compacted
        assert messages[c.start]["role"] != "system" or (
            c.start > 0 and all(m["role"] != "system" for m in messages[:1])
        )
        assert all(m["role"] == "system" for m in messages[: c.start])
        assert c.end <= len(messages) - 1
        assert _pairs_intact(messages, c.start, c.end)
        applied = apply_compaction(messages, event)
        assert applied[: c.start] == messages[: c.start]
        assert applied[c.start + len(c.replacement) :] == messages[c.end :]
        assert c.replacement[-1]["content"].startswith(SUMMARY_MARKER)
        parsed = parse_snapshot(snap, Settings())
        assert tokens_of(applied, parsed, _tokenizer()) == c.tokens_after
        assert Path(c.transcript.uri).is_file()


def _tokenizer() -> Tokenizer:
    from worker.tokens import tokenizer_for

    return tokenizer_for("gpt-4.1")


def _conversation() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "content": "sys"},
        {"id": "u1", "role": "user", "content": "Fix the bug in src/app.py please."},
    ]
    tools = ["grep", "delegate_task", "heartbeat", "edit_file", "bash"]
    for k, tool in enumerate(tools * 2):
        cid = f"c{k}"
        args = {"path": f"src/mod_{k}.py", "command": f"run {k}"}
        messages.append(
            {
                "id": f"a{k}",
                "role": "assistant",
                "content": f"step {k}",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": tool, "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        messages.append(
            {
                "id": f"r{k}",
                "role": "tool",
                "tool_call_id": cid,
                "content": f"output of {tool} {k} " + "data " * 200,
            }
        )
    messages.append({"id": "u2", "role": "user", "content": "Now also update the docs."})
    messages.append({"id": "last", "role": "assistant", "content": "On it."})
    return messages


def test_tool_hints_are_frozen_into_the_event_and_shape_the_replacement(tmp_path: Path) -> None:
    messages = _conversation()
    snap = snapshot(
        messages,
        threshold=2000,
        tools={
            "grep": {"compaction": "strip-responses"},
            "heartbeat": {"compaction": "omit"},
            "edit_file": {"compaction": "keep"},
            "bash": {"compaction": "strip-requests"},
        },
    )
    # The whole threshold as the target: what each hint carries is the point, not how much.
    snap["config"]["auto_compact_target_percent"] = 100
    event = _compact(snap, tmp_path)
    c = event.compaction
    assert c is not None
    assert {k: (v.policy, v.request, v.response) for k, v in c.tool_overrides.items()} == {
        "bash": ("strip", True, False),
        "edit_file": ("strip", False, False),
        "grep": ("strip", False, True),
        "heartbeat": ("omit", False, False),
    }
    calls = {tc["function"]["name"]: tc for m in c.replacement for tc in m.get("tool_calls") or []}
    results = {m["tool_call_id"]: m["content"] for m in c.replacement if m["role"] == "tool"}
    assert "heartbeat" not in calls and "heartbeat" not in c.summary.text
    assert json.loads(calls["grep"]["function"]["arguments"])["path"].startswith("src/")
    assert results[calls["grep"]["id"]] == STRIPPED_RESPONSE
    assert calls["bash"]["function"]["arguments"] == STRIPPED_ARGUMENTS
    assert results[calls["bash"]["id"]].startswith("output of bash")
    assert results[calls["edit_file"]["id"]].startswith("output of edit_file")
    # delegation results (no hint) are carried verbatim, the newest ones
    assert "delegate_task" in calls
    assert results[calls["delegate_task"]["id"]].startswith("output of delegate_task 6")


def test_star_hint_is_the_default_and_explicit_hints_win(tmp_path: Path) -> None:
    snap = snapshot(
        _conversation(),
        threshold=1500,
        tools={"*": {"compaction": "omit"}, "grep": {"compaction": "keep"}},
    )
    c = _compact(snap, tmp_path).compaction
    assert c is not None and c.tool_calls is not None and c.tool_calls.policy == "omit"
    names = {tc["function"]["name"] for m in c.replacement for tc in m.get("tool_calls") or []}
    assert names == {"grep"}


def test_newest_user_turns_are_carried_verbatim_before_the_summary(tmp_path: Path) -> None:
    messages = _conversation()
    c = _compact(snapshot(messages, threshold=1500), tmp_path).compaction
    assert c is not None
    users = [m["content"] for m in c.replacement if m["role"] == "user"]
    assert users[:-1] == ["Fix the bug in src/app.py please.", "Now also update the docs."]
    assert users[-1].startswith(SUMMARY_MARKER)
    assert c.end == len(messages) - 1  # only the newest group stays outside


def test_preserved_user_tokens_budget_keeps_at_least_one(tmp_path: Path) -> None:
    snap = snapshot(_conversation(), threshold=1500)
    snap["config"]["preserve_recent_user_tokens"] = 0
    c = _compact(snap, tmp_path).compaction
    assert c is not None
    users = [m["content"] for m in c.replacement[:-1] if m["role"] == "user"]
    assert users == ["Now also update the docs."]


def test_paths_from_compacted_calls_are_in_the_digest(tmp_path: Path) -> None:
    c = _compact(snapshot(_conversation(), threshold=1500), tmp_path).compaction
    assert c is not None
    carried = json.dumps(c.replacement)
    for k in range(10):
        assert f"src/mod_{k}.py" in c.summary.text or f"src/mod_{k}.py" in carried


def test_a_second_compaction_builds_on_the_first_summary(tmp_path: Path) -> None:
    messages = _conversation()
    first = _compact(snapshot(messages, threshold=1500), tmp_path)
    applied = apply_compaction(messages, first)
    grown = (
        applied
        + [
            {"id": f"x{k}", "role": "user", "content": f"more work on lib/extra_{k}.py " * 30}
            for k in range(3)
        ]
        + [{"id": "end", "role": "assistant", "content": "done"}]
    )
    second = _compact(snapshot(grown, threshold=300), tmp_path)
    assert second.compaction is not None
    text = second.compaction.summary.text
    assert "src/mod_0.py" in text  # files from the first summary accumulate
    assert text.count(SUMMARY_MARKER) == 1


def test_nothing_to_compact_is_skipped_with_a_reason(tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "x " * 3000}]
    event = _compact(snapshot(messages, threshold=10), tmp_path)
    assert event.type == "compaction.skipped"
    assert event.reason is not None and "protected" in event.reason


def test_pending_tool_call_stays_in_the_tail(tmp_path: Path) -> None:
    messages = _conversation()
    messages.append(
        {
            "id": "p",
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "pending",
                    "type": "function",
                    "function": {"name": "bash", "arguments": "{}"},
                }
            ],
        }
    )
    c = _compact(snapshot(messages, threshold=1500), tmp_path).compaction
    assert c is not None and c.end <= len(messages) - 1


def test_groups_keep_calls_with_their_results() -> None:
    parsed = parse_snapshot(snapshot(_conversation()), Settings())
    for g in group_messages(parsed.messages):
        ids = {c.id for m in parsed.messages[g.start : g.end] for c in m.tool_calls}
        answered = {m.tool_call_id for m in parsed.messages[g.start : g.end] if m.role == "tool"}
        assert answered <= ids


def test_apply_compaction_keeps_messages_appended_after_the_snapshot(tmp_path: Path) -> None:
    messages = _conversation()
    event = _compact(snapshot(messages, threshold=1500), tmp_path)
    later = [*messages, {"id": "new", "role": "user", "content": "appended later"}]
    applied = apply_compaction(later, event)
    assert applied[-1]["content"] == "appended later"
    with pytest.raises(EventMismatch, match="already applied"):
        apply_compaction(applied, event)


def test_applying_a_just_built_compaction_finds_the_range_as_the_agent_would(
    tmp_path: Path,
) -> None:
    """The pipeline applies each compaction it builds to measure ``tokens_after``, as the agent
    would but without hashing the range again: the same history results, and an applied one
    is refused."""
    messages = _conversation()
    event = _compact(snapshot(messages, threshold=1500), tmp_path)
    compaction = event.compaction
    assert compaction is not None
    applied = apply_built(messages, compaction)
    assert applied == apply_compaction(messages, event)
    with pytest.raises(EventMismatch, match="already applied"):
        apply_built(applied, compaction)
