"""Provenance (issue 14 §3): each section of a summary lists the messages it was drawn from, and
the event lists what the compaction dropped outright, so a reader can go from a sentence back
to its source through the transcript (docs/summaries.md, "Provenance")."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.histories import snapshot

from worker.client import apply_compaction, restore
from worker.config import Settings
from worker.core.provenance import HEAD_IDS, MAX_SECTION_IDS, headings
from worker.pipeline import Adapters, Pipeline
from worker.summarize import SUMMARY_MARKER, SummaryRequest
from worker.tokens import count_tokens
from worker.transcripts.filesystem import FileStore
from worker.wire import formats
from worker.wire.events import CompletedEvent, Summary, parse_event
from worker.wire.snapshots import parse_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from corpus import conversations, corpus_dir

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/screen.png"}}


def _call(mid: str, cid: str, tool: str, args: dict[str, Any], text: str = "") -> dict[str, Any]:
    return {
        "id": mid,
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {
                "id": cid,
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(args)},
            }
        ],
    }


def _result(mid: str, cid: str, content: str) -> dict[str, Any]:
    return {"id": mid, "role": "tool", "tool_call_id": cid, "content": content}


def _ok(body: str = "") -> str:
    return f"<returncode>0</returncode>\n<output>\n{body}\n</output>"


FILLER = " ".join(f"line{n}" for n in range(300))


def _history() -> list[dict[str, Any]]:
    """A hand-built session: a call that uses no file, a read, a failed test run, an edit,
    the fixing run, a conclusion and a next step; the newest user turn is carried."""
    return [
        {"id": "s", "role": "system", "content": "You are a coding agent."},
        {"id": "u1", "role": "user", "content": "Make the parser accept trailing commas in lists."},
        _call("a0", "c0", "bash", {"command": "git status"}),
        _result("r0", "c0", _ok("On branch main")),
        _call("a1", "c1", "bash", {"command": "cat src/parser.py"}, "Let me read the parser."),
        _result("r1", "c1", _ok(FILLER)),
        _call("a2", "c2", "bash", {"command": "pytest tests/test_parser.py"}),
        _result(
            "r2", "c2", "<returncode>1</returncode>\n<output>\nE   AssertionError: boom\n</output>"
        ),
        {"id": "u2", "role": "user", "content": "Do not touch the lexer, only the parser please."},
        _call("a3", "c3", "bash", {"command": "sed -i 's/a/b/' src/parser.py"}),
        _result("r3", "c3", _ok()),
        _call("a4", "c4", "bash", {"command": "pytest tests/test_parser.py -q"}),
        _result("r4", "c4", _ok(FILLER)),
        {
            "id": "a5",
            "role": "assistant",
            "content": "The fix works: trailing commas are accepted and the parser tests pass.",
        },
        {"id": "a6", "role": "assistant", "content": "Next I will update the changelog."},
        {"id": "u3", "role": "user", "content": "thanks"},
        {"id": "a7", "role": "assistant", "content": "ok"},
    ]


def _run(
    messages: list[dict[str, Any]],
    root: Path,
    *,
    llm: Any = None,
    revision: int | None = None,
    **extra: Any,
) -> CompletedEvent:
    config = extra.pop("config", {})
    snap = snapshot(messages, threshold=extra.pop("threshold", 800), **extra)
    snap["config"].update({"preserve_recent_user_tokens": 0, **config})
    if revision is not None:
        snap["revision"] = revision
    parsed = parse_snapshot(snap, Settings())
    event = Pipeline(parsed.settings, Adapters(store=FileStore(root), llm=llm)).run(parsed)[-1]
    assert isinstance(event, CompletedEvent), event
    assert_recallable(event, root)
    return event


def sections(event: CompletedEvent) -> dict[str, list[str]]:
    return {s.title: s.source_ids for s in event.compaction.summary.sections}


def assert_recallable(event: CompletedEvent, transcript_dir: Path) -> None:
    """Every id the provenance lists resolves through the recall path: the transcript the event
    names (sha256-checked), the wire ids of its compacted range (call ids: their messages)."""
    original = restore(event, store=transcript_dir)
    c = event.compaction
    in_range = formats.source_ids(original)[c.start : c.end]
    calls = {
        ref
        for m in original[c.start : c.end]
        for ref in [m.get("tool_call_id"), *(t["id"] for t in m.get("tool_calls") or [])]
        if ref
    }
    for section in c.summary.sections:
        assert set(section.source_ids) <= set(in_range), section
        assert len(set(section.source_ids)) == len(section.source_ids), section
        order = [in_range.index(i) for i in section.source_ids]
        assert order == sorted(order), section  # conversation order
    for item in c.dropped:
        assert item.message_id in in_range, item
        assert item.call_id is None or item.call_id in calls, item


# --- the digest ----------------------------------------------------------------------------


def test_each_digest_section_lists_exactly_the_messages_it_drew_from(tmp_path: Path) -> None:
    event = _run(_history(), tmp_path)
    c = event.compaction
    assert (c.start, c.end, c.preserved_ids) == (1, 16, ["u3"])
    assert sections(event) == {
        "Files touched": ["a1", "r1", "a2", "r2", "a3", "r3", "a4", "r4"],  # not git status
        "Errors seen": ["a2", "r2", "a4", "r4"],  # the failed run and the run that fixed it
        "Earlier user requests": ["u1", "u2"],
        "Latest state": ["a4", "r4", "a5", "a6"],  # last call, conclusion, next step
        "Actions": ["a0", "r0", "a1", "r1", "a2", "r2", "a3", "r3", "a4", "r4"],
    }
    # in the order of the text
    titles = [title for title, _ in headings(c.summary.text)]
    assert [s.title for s in c.summary.sections] == titles
    assert all(s.omitted_ids == 0 for s in c.summary.sections)
    assert c.dropped == []  # no hints: nothing dropped outright


def test_a_second_compaction_points_its_earlier_summary_at_the_summary_message(
    tmp_path: Path,
) -> None:
    history = _history()
    first = _run(history, tmp_path)
    applied = apply_compaction(history, first)
    (summary_id,) = [m["id"] for m in applied if m["content"].startswith(SUMMARY_MARKER)]
    more = [
        _call("a8", "c8", "bash", {"command": "cat CHANGES.md"}),
        _result("r8", "c8", _ok(FILLER)),
        {
            "id": "a9",
            "role": "assistant",
            "content": "The changelog now describes the fix in detail.",
        },
        {"id": "u4", "role": "user", "content": "good"},
        {"id": "a10", "role": "assistant", "content": "ok"},
    ]
    second = _run([*applied, *more], tmp_path, revision=first.revision + 1)
    got = sections(second)
    assert "Earlier summary" not in got
    assert got["Errors seen"] == [summary_id]
    assert got["Task state"] == [summary_id]
    # src/parser.py and tests/test_parser.py come from the earlier summary, CHANGES.md from a8
    assert got["Files touched"] == [summary_id, "a8", "r8"]


def test_a_kept_facts_repair_lists_the_repaired_facts_messages(tmp_path: Path) -> None:
    history = _history()
    history[4]["content"] = "See https://example.com/issues/42 for the report."  # a1: an identifier
    event = _run(history, tmp_path)
    got = sections(event)
    text = event.compaction.summary.text
    assert "id `https://example.com/issues/42`" in text.split("## Kept facts", 1)[1]
    assert got["Kept facts"] == ["a1"]


def test_a_section_the_output_bound_cut_away_is_not_listed(tmp_path: Path) -> None:
    event = _run(_history(), tmp_path, config={"summary_max_output_tokens": 120})
    c = event.compaction
    assert c.summary.truncated
    titles = [title for title, _ in headings(c.summary.text)]
    assert [s.title for s in c.summary.sections] == titles
    assert "Actions" not in titles  # it gave way first


def test_long_lists_keep_the_first_and_newest_ids_and_count_the_rest(tmp_path: Path) -> None:
    messages: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "content": "sys"},
        {"id": "u", "role": "user", "content": "List every module."},
    ]
    for k in range(60):
        messages.append(_call(f"a{k}", f"c{k}", "bash", {"command": f"ls pkg{k}"}))
        messages.append(_result(f"r{k}", f"c{k}", _ok(f"mod_{k}.py " * 20)))
    messages += [
        {"id": "u2", "role": "user", "content": "thanks"},
        {"id": "z", "role": "assistant", "content": "ok"},
    ]
    event = _run(messages, tmp_path, threshold=2000, config={"summary_max_output_tokens": 2000})
    actions = next(s for s in event.compaction.summary.sections if s.title == "Actions")
    every = [m["id"] for m in messages[2:-2]]
    assert len(every) == 120 > MAX_SECTION_IDS
    tail = MAX_SECTION_IDS - HEAD_IDS
    assert actions.source_ids == every[:HEAD_IDS] + every[-tail:]
    assert actions.omitted_ids == len(every) - MAX_SECTION_IDS


def test_anthropic_sections_name_wire_messages(tmp_path: Path) -> None:
    """A user message holding tool results is one wire message (normalized: ``ID/rN``)."""

    def use(k: int, command: str) -> dict[str, Any]:
        block = {"type": "tool_use", "id": f"t{k}", "name": "bash", "input": {"command": command}}
        return {"id": f"a{k}", "role": "assistant", "content": [block]}

    def results(k: int, body: str) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": f"t{k}", "content": body}
        return {"id": f"r{k}", "role": "user", "content": [block]}

    messages = [
        {"id": "u1", "role": "user", "content": "Read the parser and run its tests."},
        use(1, "cat src/parser.py"),
        results(1, _ok(FILLER)),
        use(2, "pytest tests/test_parser.py"),
        results(2, _ok(FILLER)),
        {"id": "a3", "role": "assistant", "content": "Both look fine: the parser tests pass."},
        {"id": "u2", "role": "user", "content": "thanks"},
        {"id": "a4", "role": "assistant", "content": "ok"},
    ]
    event = _run(messages, tmp_path, format="anthropic", threshold=600)
    got = sections(event)
    assert got["Files touched"] == ["a1", "r1", "a2", "r2"]
    assert all("/" not in i for ids in got.values() for i in ids)


# --- the LLM summary -----------------------------------------------------------------------


class HeadingLLM:
    """An LLM that answers a fixed Markdown text."""

    def __init__(self, body: str) -> None:
        self.body = body

    def summarize(self, request: SummaryRequest) -> Summary:
        text = f"{SUMMARY_MARKER}\n{self.body}"
        return Summary(text=text, tokens=count_tokens(text, request.model), source="llm")


LLM_TEXT = """\
Work on `src/parser.py`.
## Goal
Make the parser accept trailing commas in lists.
## Artifacts and files touched
- `src/parser.py`: edited
```
# a comment in a code block is not a heading
```
### Errors and outcomes
`pytest tests/test_parser.py` failed, then passed.
## Next steps
none
"""


def test_an_llm_summary_is_attributed_by_the_facts_each_section_holds(tmp_path: Path) -> None:
    event = _run(_history(), tmp_path, llm=HeadingLLM(LLM_TEXT), config={"mode": "remote_only"})
    c = event.compaction
    assert c.summary.source == "llm"
    assert [s.title for s in c.summary.sections] == [
        "",  # the text before the first heading
        "Goal",
        "Artifacts and files touched",
        "Errors and outcomes",
        "Next steps",
        "Kept facts",
    ]
    got = sections(event)
    parser = ["a1", "r1", "a3", "r3"]  # the calls that used src/parser.py
    assert got[""] == parser
    assert got["Goal"] == ["u1"]  # the task, as the user stated it
    assert got["Artifacts and files touched"] == parser
    # the failed command and its fix; tests/test_parser.py is the same calls
    assert got["Errors and outcomes"] == ["a2", "r2", "a4", "r4"]
    assert got["Next steps"] == []
    # repaired: the instruction (u2), the last state (a5) and the next step (a6)
    kept = c.summary.text.split("## Kept facts", 1)[1]
    assert "instruction: Do not touch the lexer" in kept and "latest: The fix works" in kept
    assert got["Kept facts"] == ["u2", "a5", "a6"]


def test_headings_skip_code_fences_and_closing_hashes() -> None:
    text = "intro\n# One #\n```\n## not this\n```\n####### seven is text\n##\tTwo\n#nospace\n"
    assert [t for t, _ in headings(text)] == ["One", "Two"]


# --- what was dropped ------------------------------------------------------------------------


def _hinted_history() -> list[dict[str, Any]]:
    tools = ["grep", "heartbeat", "edit_file", "bash", "bash"]
    messages: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "content": "sys"},
        {
            "id": "u1",
            "role": "user",
            "content": [{"type": "text", "text": "Fix what this screenshot shows."}, IMAGE],
        },
    ]
    for k, tool in enumerate(tools):
        args = {"path": f"src/mod_{k}.py", "command": f"run {k}"}
        messages.append(_call(f"a{k}", f"c{k}", tool, args, f"step {k}"))
        messages.append(_result(f"r{k}", f"c{k}", f"output of {tool} {k} " + "data " * 200))
    messages += [
        {
            "id": "u2",
            "role": "user",
            "content": [{"type": "text", "text": "Compare with this one: " + "word " * 400}, IMAGE],
        },
        {"id": "last", "role": "assistant", "content": "On it."},
    ]
    return messages


def test_each_policy_lists_what_it_dropped(tmp_path: Path) -> None:
    messages = _hinted_history()
    hints = {
        "grep": {"compaction": "strip-responses"},
        "heartbeat": {"compaction": "omit"},
        "edit_file": {"compaction": "keep"},
        "bash": {"compaction": "strip"},
    }
    event = _run(
        messages,
        tmp_path,
        threshold=1200,
        tools=hints,
        config={"preserve_recent_user_tokens": 50, "summary_max_output_tokens": 300},
    )
    c = event.compaction

    def size(text: str) -> int:
        return len(text.encode())

    arguments = {m["tool_calls"][0]["id"]: m["tool_calls"][0]["function"]["arguments"]
                 for m in messages if m.get("tool_calls")}  # fmt: skip
    outputs = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    got = [(d.kind, d.message_id, d.call_id, d.tool, d.bytes, d.attachment) for d in c.dropped]
    shortened = next(d for d in c.dropped if d.kind == "user_message_shortened")
    assert got == [
        ("attachment_dropped", "u1", None, None, None, "[image 1 in message u1]"),
        ("tool_output_stripped", "r0", "c0", "grep", size(outputs["c0"]), None),
        ("tool_call_omitted", "a1", "c1", "heartbeat", size(arguments["c1"] + outputs["c1"]), None),
        ("tool_arguments_stripped", "a3", "c3", "bash", size(arguments["c3"]), None),
        ("tool_output_stripped", "r3", "c3", "bash", size(outputs["c3"]), None),
        ("tool_arguments_stripped", "a4", "c4", "bash", size(arguments["c4"]), None),
        ("tool_output_stripped", "r4", "c4", "bash", size(outputs["c4"]), None),
        ("user_message_shortened", "u2", None, None, shortened.bytes, None),
    ]
    # the shortened turn is carried with its image: only its text gave way
    carried_u2 = next(m for m in c.replacement if m.get("id") == "u2")
    assert IMAGE in carried_u2["content"]
    assert shortened.bytes is not None and 0 < shortened.bytes < size(
        messages[-2]["content"][0]["text"]
    )
    # names and sizes only: no content of a dropped body is in the entries
    assert "data data" not in json.dumps([d.model_dump() for d in c.dropped])


# --- events of older versions --------------------------------------------------------------


def test_an_event_without_provenance_still_parses(tmp_path: Path) -> None:
    event = _run(_history(), tmp_path)
    doc = json.loads(event.to_json())
    old = copy.deepcopy(doc)
    del old["compaction"]["dropped"]
    del old["compaction"]["summary"]["sections"]
    parsed = parse_event(old)
    assert isinstance(parsed, CompletedEvent)
    assert parsed.compaction.dropped == [] and parsed.compaction.summary.sections == []
    assert apply_compaction(_history(), parsed) == apply_compaction(_history(), event)
    # and a newer one with more fields in the new objects reads as well
    new = copy.deepcopy(doc)
    new["compaction"]["summary"]["sections"][0]["confidence"] = 0.9
    assert parse_event(new) == event


# --- the shared corpus ---------------------------------------------------------------------


def _sample() -> list[tuple[str, dict[str, Any]]]:
    return [c for k, c in enumerate(conversations()) if k % 5 == 0] if corpus_dir() else []


@pytest.mark.corpus
@pytest.mark.skipif(
    corpus_dir() is None,
    reason="corpus absent: set COMPACTOR_CORPUS_DIR or place it at ../shared/corpus",
)
def test_every_corpus_compaction_lists_recallable_sources(tmp_path: Path) -> None:
    """Every fifth real conversation, compacted with bash outputs stripped (so that something
    is dropped): every section and dropped entry names messages of the range, recallable from
    the transcript, and every listed section is in the text."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
    from corpus_compact_bench import with_small_window

    hints = {"bash": {"compaction": "strip-responses"}}
    for k, (name, snap) in enumerate(_sample()):
        small = with_small_window(snap)
        if k % 2:
            small = {**small, "tools": hints}
        root = tmp_path / name
        parsed = parse_snapshot(small, Settings())
        events = Pipeline(parsed.settings, Adapters(store=FileStore(root))).run(parsed)
        event = events[-1]
        assert isinstance(event, CompletedEvent), name
        assert_recallable(event, root)
        c = event.compaction
        titles = [t for t, _ in headings(c.summary.text)]
        listed = [s.title for s in c.summary.sections]
        assert listed and all(t in titles for t in listed), name
        assert any(s.source_ids for s in c.summary.sections), name
        if k % 2:
            assert c.dropped and {d.kind for d in c.dropped} <= {
                "tool_output_stripped",
                "user_message_shortened",
            }, name
