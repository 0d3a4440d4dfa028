"""Must-keep facts (issue 14 §1): extracted before summarizing, checked after, repaired within
the output bound, published as ``summary.fidelity``; prefer_remote falls back on a poor LLM
summary."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.histories import snapshot

from worker.config import Settings
from worker.core import fidelity
from worker.core.fidelity import KINDS, Fact, carried_text, ensure, extract_must_keep, missing_facts
from worker.pipeline import Adapters, Pipeline
from worker.summarize import SUMMARY_MARKER, SummaryRequest
from worker.tokens import count_tokens, encoding_name_for_model, get_encoding
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent, Summary
from worker.wire.formats import to_messages
from worker.wire.snapshots import parse_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from corpus import conversations, corpus_dir


class ForgetfulLLM:
    """An LLM that keeps nothing: every fact must come from the repair."""

    def __init__(self, text: str = "The agent worked on the code.") -> None:
        self.text = text

    def summarize(self, request: SummaryRequest) -> Summary:
        text = f"{SUMMARY_MARKER}\n{self.text}"
        return Summary(text=text, tokens=count_tokens(text, request.model), source="llm")


def _call(k: int, tool: str, args: dict[str, Any], text: str = "") -> dict[str, Any]:
    return {
        "id": f"a{k}",
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(args)},
            }
        ],
    }


def _result(k: int, content: str) -> dict[str, Any]:
    return {"id": f"r{k}", "role": "tool", "tool_call_id": f"c{k}", "content": content}


def _conversation() -> list[dict[str, Any]]:
    filler = " ".join(f"line{n}" for n in range(400))
    return [
        {"id": "s", "role": "system", "content": "You are a coding agent."},
        {"id": "u1", "role": "user", "content": "Make the parser accept trailing commas in lists."},
        _call(1, "bash", {"command": "cat src/parser.py"}, "Let me read the parser."),
        _result(1, f"<returncode>0</returncode>\n<output>\n{filler}\n</output>"),
        _call(2, "bash", {"command": "pytest tests/test_parser.py::test_trailing_comma"}),
        _result(2, "<returncode>1</returncode>\n<output>\nE   AssertionError: boom\n</output>"),
        {"id": "u2", "role": "user", "content": "Do not touch the lexer, only the parser please."},
        _call(
            3, "bash", {"command": "sed -i 's/a/b/' src/parser.py && git checkout -b fix-commas"}
        ),
        _result(3, "<returncode>0</returncode>\n<output>\n</output>"),
        _call(
            4,
            "delegate_task",
            {"task": "Review the parser change for edge cases"},
            "See https://example.com/issues/42 and commit 1a2b3c4d for context.",
        ),
        _result(4, "Reviewed: nested lists with trailing commas also work now."),
        _call(
            5,
            "bash",
            {"command": "pytest tests/test_parser.py"},
            "The fix works: trailing commas are accepted, and the parser tests pass again.",
        ),
        _result(5, f"<returncode>0</returncode>\n<output>\n{filler}\n</output>"),
        {"id": "a6", "role": "assistant", "content": "Next I will update the changelog."},
        {"id": "u3", "role": "user", "content": "thanks"},
        {"id": "a7", "role": "assistant", "content": "ok"},
    ]


def _run(messages: list[dict[str, Any]], root: Path, llm: Any = None, **config: Any) -> Any:
    snap = snapshot(messages, threshold=800)
    snap["config"].update({"preserve_recent_user_tokens": 0, **config})
    parsed = parse_snapshot(snap, Settings())
    return Pipeline(parsed.settings, Adapters(store=FileStore(root), llm=llm)).run(parsed)[-1]


def _facts_and_carried(
    event: CompletedEvent, messages: list[dict[str, Any]]
) -> tuple[list[Any], str]:
    c = event.compaction
    ranged = to_messages("openai", messages[c.start : c.end])
    facts = extract_must_keep(ranged, ["delegate_task", "task", "agent"])
    carried = carried_text(to_messages("openai", c.replacement[:-1]))
    return facts, carried


def test_every_kind_is_extracted() -> None:
    messages = to_messages("openai", _conversation()[1:-2])
    kinds = {f.kind for f in extract_must_keep(messages, ["delegate_task"])}
    assert kinds == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_after_repair_every_fact_of_each_kind_is_kept(kind: str, tmp_path: Path) -> None:
    messages = _conversation()
    event = _run(messages, tmp_path, llm=ForgetfulLLM(), mode="remote_only")
    assert isinstance(event, CompletedEvent)
    summary = event.compaction.summary
    facts, carried = _facts_and_carried(event, messages)
    of_kind = [f for f in facts if f.kind == kind]
    assert of_kind, kind
    assert missing_facts(of_kind, summary.text, carried) == []
    assert summary.fidelity is not None and summary.fidelity.repaired > 0
    assert summary.fidelity.dropped == {}
    assert summary.tokens <= 2000 and summary.tokens == count_tokens(summary.text, "gpt-4.1")


def test_a_tight_bound_drops_the_least_important_facts_first(tmp_path: Path) -> None:
    messages = _conversation()
    event = _run(
        messages, tmp_path, llm=ForgetfulLLM(), mode="remote_only", summary_max_output_tokens=90
    )
    summary = event.compaction.summary
    fidelity = summary.fidelity
    assert summary.tokens <= 90
    assert fidelity.dropped, "the bound is too tight to keep everything"
    assert "task" not in fidelity.dropped
    assert fidelity.kept + fidelity.repaired + sum(fidelity.dropped.values()) == fidelity.checked
    worst = max(KINDS.index(k) for k in fidelity.dropped)
    facts, carried = _facts_and_carried(event, messages)
    lost = missing_facts(facts, summary.text, carried)
    # Only facts as or less important than a dropped kind are missing... and the kept ones fit.
    assert all(KINDS.index(f.kind) <= worst for f in lost)
    assert "task" not in {f.kind for f in lost}


def test_prefer_remote_uses_the_digest_when_the_llm_summary_scores_too_low(tmp_path: Path) -> None:
    messages = _conversation()
    event = _run(messages, tmp_path, llm=ForgetfulLLM(), mode="prefer_remote")
    summary = event.compaction.summary
    assert summary.source == "digest"
    assert summary.fallback_reason is not None
    assert summary.fallback_reason.startswith("summary_fidelity")
    kept = _run(
        messages, tmp_path / "2", llm=ForgetfulLLM(), mode="prefer_remote", min_summary_fidelity=0
    )
    assert kept.compaction.summary.source == "llm"


def test_the_digest_is_checked_too(tmp_path: Path) -> None:
    event = _run(_conversation(), tmp_path)
    fidelity = event.compaction.summary.fidelity
    assert event.compaction.summary.source == "digest"
    assert fidelity is not None and fidelity.checked > 0 and fidelity.score > 0.5


@pytest.mark.corpus
@pytest.mark.skipif(corpus_dir() is None, reason="corpus absent: set COMPACTOR_CORPUS_DIR")
def test_every_corpus_compaction_carries_fidelity_and_keeps_what_fits() -> None:
    from corpus_compact_bench import with_small_window

    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, snap) in enumerate(conversations()):
            small = with_small_window(snap)
            llm = ForgetfulLLM() if k % 2 else None  # half through the repair of a poor summary
            parsed = parse_snapshot(small, Settings())
            settings = parsed.settings.model_copy(
                update={
                    "compaction": parsed.settings.compaction.model_copy(
                        update={"mode": "remote_only" if llm else "local_only"}
                    )
                }
            )
            pipeline = Pipeline(settings, Adapters(store=FileStore(Path(tmp)), llm=llm))
            event = pipeline.run(parsed)[-1]
            assert isinstance(event, CompletedEvent), name
            summary = event.compaction.summary
            fidelity = summary.fidelity
            assert fidelity is not None, name
            assert summary.tokens <= settings.compaction.summary_max_output_tokens
            facts, carried = _facts_and_carried(event, small["messages"])
            assert fidelity.checked == len(facts), name
            lost = missing_facts(facts, summary.text, carried)
            assert len(lost) == sum(fidelity.dropped.values()), (name, fidelity, lost[:3])


def test_a_summary_filling_the_bound_is_cut_to_make_room_for_the_most_important_facts(
    tmp_path: Path,
) -> None:
    wordy = ForgetfulLLM(" ".join(f"word{n}" for n in range(600)))
    event = _run(
        _conversation(), tmp_path, llm=wordy, mode="remote_only", summary_max_output_tokens=300
    )
    summary = event.compaction.summary
    assert summary.tokens <= 300
    assert summary.truncated and summary.text.startswith(SUMMARY_MARKER)
    assert "## Kept facts\n- task: Make the parser accept trailing commas" in summary.text
    assert summary.fidelity.repaired > 0 and "task" not in summary.fidelity.dropped


# --- the repair's cost: one pass over the facts, not a recount of the section per fact ---------

# Lines as facts state them, and worse: line breaks (before "/", "\r", blank lines), runs of
# punctuation, digits, spaces and tabs, non-ASCII: every junction the tokenizer treats specially.
_LINE_PIECES = ["word", " ", "\t", "\n", "\r", "/", "//x", "-", "`", ")", "...", "12", "3.5",
                "'s", "é", "🙂", "\n\n", "  \n", ":", "#", "src/a.py"]  # fmt: skip
lines = st.lists(st.sampled_from(_LINE_PIECES), min_size=1, max_size=12).map("".join)


def _fact(k: int, line: str, kind: str = "identifier") -> Fact:
    return Fact(kind, (f"probe-{k}",), line, (f"m{k}",))


def _fitting_by_recounting(
    body: str, missing: list[Fact], limit: int, model: str
) -> tuple[str, list[Fact]]:
    """The repair's specification: each fact in order is added when the whole text, counted
    again with its line, stays within ``limit``."""
    taken: list[Fact] = []
    for fact in missing:
        candidate = fidelity._with_facts(body, [f.line for f in [*taken, fact]])
        if count_tokens(candidate, model) <= limit:
            taken.append(fact)
    text = fidelity._with_facts(body, [f.line for f in taken]) if taken else body
    return text, taken


@given(
    body=lines,
    missing=st.lists(lines, min_size=1, max_size=12),
    room=st.integers(-2, 60),
    model=st.sampled_from(["gpt-4.1", "gpt-4"]),
)
def test_the_section_counted_a_line_at_a_time_is_the_exact_count(
    body: str, missing: list[str], room: int, model: str
) -> None:
    facts = [_fact(k, line) for k, line in enumerate(missing)]
    body = f"{SUMMARY_MARKER}\n{body}"
    limit = count_tokens(body, model) + room
    text, added, tokens = fidelity._append_fitting(body, facts, limit, model)
    assert (text, added) == _fitting_by_recounting(body, facts, limit, model)
    assert tokens == count_tokens(text, model)
    assert not added or tokens <= limit


def _tokenized_chars(monkeypatch: pytest.MonkeyPatch, model: str) -> list[int]:
    """The length of every text handed to tiktoken for ``model`` from now on."""
    encoding = get_encoding(encoding_name_for_model(model))
    encode = encoding.encode_ordinary
    sizes: list[int] = []

    def spy(text: str) -> list[int]:
        sizes.append(len(text))
        return encode(text)

    monkeypatch.setattr(encoding, "encode_ordinary", spy)
    return sizes


def _repair_cost(n: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Characters tokenized to repair a summary that lacks all of ``n`` facts, every one of
    which fits the (generous) bound."""
    facts = [_fact(k, f"id `{k:08x}-{k}` used by the call of step {k}") for k in range(n)]
    summary = Summary(text=f"{SUMMARY_MARKER}\nThe agent worked.", tokens=8, source="llm")
    with monkeypatch.context() as patch:
        sizes = _tokenized_chars(patch, "gpt-4.1")
        repaired = ensure(summary, facts, "", limit=10**7, model="gpt-4.1")
    assert repaired.fidelity is not None and repaired.fidelity.repaired == n
    assert repaired.tokens == count_tokens(repaired.text, "gpt-4.1") <= 10**7
    return sum(sizes)


def test_the_repair_is_linear_in_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    # Recounting the growing section once per fact tokenized ~n²/2 lines: 100 times more
    # text for ten times the facts. A line at a time it is ten times (plus the final count).
    small, large = _repair_cost(1_000, monkeypatch), _repair_cost(10_000, monkeypatch)
    assert large <= 15 * small, (small, large)


def test_a_fact_said_again_and_again_is_one_fact_with_every_source() -> None:
    raw = [{"id": "u0", "role": "user", "content": "Fix the parser."}]
    for k in range(1, 3001):
        raw.append({"id": f"a{k}", "role": "assistant", "content": f"step {k}"})
        raw.append({"id": f"u{k}", "role": "user", "content": "continue"})
    facts = extract_must_keep(to_messages("openai", raw), [])
    instructions = [f for f in facts if f.kind == "instruction"]
    assert [(f.probes, f.line) for f in instructions] == [(("continue",), "instruction: continue")]
    assert instructions[0].sources == tuple(f"u{k}" for k in range(1, 3001))


def _assistant(text: str, index: int = 1) -> Any:
    from worker.wire.models import Message

    return Message(id=f"a{index}", role="assistant", content=text, source_index=index)


def test_identifiers_the_agent_used_are_must_keep_facts() -> None:
    said = _assistant("See https://example.com/issues/42, job 550e8400-e29b-41d4-a716-446655440000")
    ran = _assistant(
        "git show 3f2a9c1 && pytest tests/test_a.py::test_b -k test_c && git switch -c fix/x", 2
    )
    facts = extract_must_keep([said, ran], [])
    assert [f.probes[0] for f in facts if f.kind == "identifier"] == [
        "https://example.com/issues/42",
        "550e8400-e29b-41d4-a716-446655440000",
        "3f2a9c1",
        "tests/test_a.py::test_b",
        "test_c",
        "fix/x",
    ]


_NEAR_UUIDS = st.lists(
    st.one_of(
        st.uuids().map(str),
        st.uuids().map(lambda u: str(u)[: len(str(u)) // 2]),
        st.text(alphabet="0123456789abcdefx- _\n", max_size=12),
    ),
    max_size=6,
).map("".join)


@given(_NEAR_UUIDS)
def test_a_uuid_is_found_wherever_it_is(text: str) -> None:
    """The UUID pattern runs only on texts that hold a UUID's middle ("-hhhh-hhhh-hhhh-"): that
    must never hide one."""
    uuids = list(dict.fromkeys(fidelity._UUID.findall(text)))
    ids = fidelity._identifiers([_assistant(text)])
    assert [i for i in ids if fidelity._UUID.fullmatch(i)] == uuids
